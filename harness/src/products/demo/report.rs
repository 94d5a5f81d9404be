//! The demo's matrix as it reports it: a [`Cell`] per scenario and
//! approach, the table of docs/benchmarks/demo.md ([`matrix_table`]), the report file
//! ([`Report`], `target/demo/report.json`) and the matrix chart
//! ([`matrix_chart`], `target/demo/chart.svg`). One run's numbers and its
//! per-provider chart are [`crate::support::run_report`]'s.

use serde::Serialize;

use crate::support::load::Sample;
use crate::support::run_report::{escape, percentile, share_text, RunReport};

/// One cell of the matrix: a scenario run with one approach.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub scenario: String,
    /// `graceful` for the filters; `sleep_3s`, `sleep_15s`, `registry_only`
    /// or `plain` for plain Envoy.
    pub approach: String,
    #[serde(flatten)]
    pub run: RunReport,
}

/// The matrix as docs/benchmarks/demo.md's table (Markdown), a row per cell.
pub fn matrix_table(cells: &[Cell]) -> String {
    let mut table = String::from(
        "| scenario | approach | protocol | requests | failed | after closing | drain (closing to gone), mean | retries | p50 ms | p99 ms | max ms | max share |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        let r = &c.run;
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} s | {} | {:.1} | {:.1} | {:.1} | {} |\n",
            c.scenario,
            c.approach,
            format!("{:?}", r.protocol).to_lowercase(),
            r.requests,
            r.failed,
            r.after_closing,
            r.mean_gone_s(),
            r.retries,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            share_text(r.max_share)
        ));
    }
    table
}

/// The report file: scenario 1's graceful and baseline (`sleep_3s`) runs
/// at the top, as the public contract fixes, and every cell in `matrix`.
#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graceful: Option<RunReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<RunReport>,
    pub matrix: Vec<Cell>,
}

/// Approach colours in the matrix chart.
fn approach_color(approach: &str) -> &'static str {
    match approach {
        "graceful" => "#2ca02c",
        "graceful_no_admin" => "#17becf",
        "sleep_3s" => "#ff7f0e",
        "sleep_15s" => "#9467bd",
        "registry_only" => "#d62728",
        _ => "#7f7f7f",
    }
}

/// p99 latency (ms) of the short requests due in each second, and whether
/// a request due in that second failed.
fn p99_per_second(samples: &[Sample], span_ms: u64) -> Vec<(Option<f64>, bool)> {
    let secs = (span_ms / 1000 + 1) as usize;
    let mut buckets: Vec<Vec<u64>> = vec![Vec::new(); secs];
    let mut failed = vec![false; secs];
    for s in samples {
        let b = ((s.due_ms / 1000) as usize).min(secs - 1);
        if !s.ok {
            failed[b] = true;
        } else if !s.long {
            buckets[b].push(s.latency_us);
        }
    }
    buckets
        .into_iter()
        .zip(failed)
        .map(|(mut b, f)| {
            b.sort_unstable();
            let p99 = (!b.is_empty()).then(|| percentile(&b, 0.99) as f64 / 1000.0);
            (p99, f)
        })
        .collect()
}

/// The matrix chart's layout: the summary's height, then cells of this
/// size, so many to a row.
const SUMMARY_H: f64 = 300.0;
const COLS: usize = 3;
const CELL_W: f64 = 360.0;
const CELL_H: f64 = 170.0;

/// The matrix chart: a summary (failed requests against drain time, one
/// point per cell), then per cell the p99 latency of each second (log
/// scale) with each shutdown's closing (dashed) and process-gone (solid)
/// moments, and the seconds with a failed request in red.
pub fn matrix_chart(cells: &[(&Cell, &[Sample])]) -> String {
    let w = 1080.0;
    let rows = cells.len().div_ceil(COLS);
    let height = SUMMARY_H + CELL_H * rows as f64 + 20.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    push_summary(&mut svg, cells);
    for (i, (c, samples)) in cells.iter().enumerate() {
        push_cell(&mut svg, i, c, samples);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The summary: x = mean drain time (closing to process gone), y =
/// failed, one point per cell, and the approaches' legend.
fn push_summary(svg: &mut String, cells: &[(&Cell, &[Sample])]) {
    let (left, top, pw, ph) = (70.0, 40.0, 620.0, 220.0);
    let max_x = cells
        .iter()
        .map(|(c, _)| c.run.mean_gone_s())
        .fold(1.0, f64::max)
        * 1.1;
    let max_y = cells
        .iter()
        .map(|(c, _)| c.run.failed)
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.1;
    svg.push_str(&format!(
        "<text x=\"{left}\" y=\"22\" font-size=\"13\" font-weight=\"bold\">Failed requests against drain time (closing to process gone, mean per shutdown), one point per cell</text>\n"
    ));
    svg.push_str(&format!(
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{b}\" stroke=\"#333\"/><line x1=\"{left}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#333\"/>\n<text x=\"{left}\" y=\"{lb}\">0</text><text x=\"{r0}\" y=\"{lb}\">{max_x:.0} s</text><text x=\"8\" y=\"{t8}\">{max_y:.0}</text><text x=\"8\" y=\"{b}\">0 failed</text>\n",
        b = top + ph,
        r = left + pw,
        lb = top + ph + 14.0,
        r0 = left + pw - 20.0,
        t8 = top + 8.0
    ));
    for (i, (c, _)) in cells.iter().enumerate() {
        let x = left + pw * c.run.mean_gone_s() / max_x;
        let y = top + ph * (1.0 - c.run.failed as f64 / max_y);
        let color = approach_color(&c.approach);
        svg.push_str(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{color}\" fill-opacity=\"0.8\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\" font-size=\"9\">{}</text>\n",
            x + 7.0,
            y + 3.0 + (i % 3) as f64 * 3.0,
            escape(&format!("{} {:?}", c.scenario, c.run.protocol).to_lowercase())
        ));
    }
    for (i, a) in [
        "graceful",
        "sleep_3s",
        "sleep_15s",
        "registry_only",
        "plain",
    ]
    .iter()
    .enumerate()
    {
        svg.push_str(&format!(
            "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"5\" fill=\"{c}\"/><text x=\"{tx}\" y=\"{ty}\">{a}</text>\n",
            cx = left + pw + 40.0,
            cy = top + 10.0 + 18.0 * i as f64,
            c = approach_color(a),
            tx = left + pw + 50.0,
            ty = top + 14.0 + 18.0 * i as f64
        ));
    }
}

/// Cell `i`: its p99 per second, log scale 1 ms .. 10 s.
fn push_cell(svg: &mut String, i: usize, c: &Cell, samples: &[Sample]) {
    let (cols, cell_w, cell_h, sum_h) = (COLS, CELL_W, CELL_H, SUMMARY_H);
    let log_min = 0.0f64; // 1 ms
    let log_max = 4.0f64; // 10 s
    let x0 = (i % cols) as f64 * cell_w + 10.0;
    let y0 = sum_h + (i / cols) as f64 * cell_h;
    let (l, t, cw, ch) = (x0 + 40.0, y0 + 28.0, cell_w - 60.0, cell_h - 55.0);
    let span = c.run.duration_ms.max(1);
    let x = |ms: f64| l + cw * ms / span as f64;
    let y = |v: f64| t + ch * (1.0 - (v.max(1.0).log10() - log_min) / (log_max - log_min));
    svg.push_str(&format!(
        "<text x=\"{x0}\" y=\"{:.1}\" font-weight=\"bold\" fill=\"{}\">{}</text>\n<text x=\"{x0}\" y=\"{:.1}\" font-size=\"9\">{} failed, drain {:.1} s, p99 {:.0} ms</text>\n",
        y0 + 12.0,
        approach_color(&c.approach),
        escape(&format!("{} / {} / {:?}", c.scenario, c.approach, c.run.protocol).to_lowercase()),
        y0 + 23.0,
        c.run.failed,
        c.run.mean_gone_s(),
        c.run.p99_ms
    ));
    svg.push_str(&format!(
        "<rect x=\"{l}\" y=\"{t}\" width=\"{cw}\" height=\"{ch}\" fill=\"none\" stroke=\"#999\"/>\n"
    ));
    for (v, label) in [
        (1.0, "1ms"),
        (10.0, "10ms"),
        (100.0, "100ms"),
        (1000.0, "1s"),
        (10000.0, "10s"),
    ] {
        svg.push_str(&format!(
            "<line x1=\"{l}\" y1=\"{yy:.1}\" x2=\"{r}\" y2=\"{yy:.1}\" stroke=\"#eee\"/><text x=\"{lx}\" y=\"{ty:.1}\" font-size=\"8\">{label}</text>\n",
            yy = y(v),
            r = l + cw,
            lx = x0,
            ty = y(v) + 3.0
        ));
    }
    for e in &c.run.events {
        for (ms, dash) in [(e.closing_ms, "4 3"), (e.down_ms, "")] {
            svg.push_str(&format!(
                "<line x1=\"{xm:.1}\" y1=\"{t}\" x2=\"{xm:.1}\" y2=\"{b}\" stroke=\"#555\" stroke-dasharray=\"{dash}\"/>\n",
                xm = x(ms as f64),
                b = t + ch
            ));
        }
    }
    let series = p99_per_second(samples, span);
    let points: Vec<String> = series
        .iter()
        .enumerate()
        .filter_map(|(s, (p99, _))| {
            p99.map(|v| format!("{:.1},{:.1}", x(s as f64 * 1000.0 + 500.0), y(v)))
        })
        .collect();
    svg.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        approach_color(&c.approach),
        points.join(" ")
    ));
    for (s, (_, failed)) in series.iter().enumerate() {
        if *failed {
            svg.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"4\" fill=\"#d62728\"/>\n",
                x(s as f64 * 1000.0),
                t + ch - 4.0,
                (cw / (span as f64 / 1000.0)).max(1.0)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::run_report::fixtures::one_shutdown;

    #[test]
    fn the_matrix_table_has_a_row_per_cell_with_its_max_share() {
        // Even: the two left alternate, each half of the load; piled: provider
        // 3 takes everything (run_report's max_share test).
        let even = one_shutdown(|due_ms| (due_ms / 10 % 2 + 2) as u8);
        let piled = one_shutdown(|_| 3);
        let cell = |approach: &str, run: &RunReport| Cell {
            scenario: "today".into(),
            approach: approach.into(),
            run: run.clone(),
        };
        let table = matrix_table(&[cell("graceful", &even), cell("sleep_3s", &piled)]);
        assert!(table.starts_with("| scenario |") && table.contains("| max share |"));
        assert!(table.contains("| today | sleep_3s | http1 | 400 | 0 | 0 | 1.0 s | 0 |"));
        assert!(table.ends_with("| 1.000 |\n"), "{table}");
    }
}
