//! What a demo run reports: the numbers (`target/demo/report.json`) and a
//! chart of requests per second per provider with the shutdown moments
//! (`target/demo/chart.svg`).

use serde::Serialize;

use super::load::{Protocol, Sample};

/// The moments of one provider's shutdown and return, in ms since the run
/// started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProviderEvents {
    /// 1-based provider index.
    pub provider: usize,
    /// Closing started (`POST /graceful/closing`, or `/healthcheck/fail` in
    /// the baseline).
    pub closing_ms: u64,
    /// The consumer saw it closing: its first tombstone for the provider (in
    /// the baseline, where nothing tells the consumer, the closing moment).
    pub seen_ms: u64,
    /// The drain gate passed (baseline: the fixed sleep ended).
    pub drained_ms: u64,
    /// Envoy and the app got SIGTERM and exited.
    pub down_ms: u64,
    /// The new instance answered its readiness probe.
    pub up_ms: u64,
    /// Requests that reached this provider after `seen_ms` (its access log).
    pub after_closing: u64,
    /// The access log of the instance that went down.
    #[serde(skip)]
    pub access_log: std::path::PathBuf,
}

/// One run, graceful or baseline. Field names up to `drain_ms` are fixed
/// by the public contract.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub requests: u64,
    pub failed: u64,
    pub after_closing: u64,
    /// Closing-to-drained time of each restarted provider.
    pub drain_ms: Vec<u64>,
    /// Retries the consumer's Envoy made (`cluster.providers.upstream_rq_retry`).
    pub retries: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub protocol: Protocol,
    pub rate: u32,
    pub duration_ms: u64,
    pub events: Vec<ProviderEvents>,
    /// The consumer Envoy's resident size when the load started and ended.
    pub consumer_rss_kb: [u64; 2],
    /// The consumer's outbound in-flight gauge after the load (must be 0).
    pub consumer_inflight_end: u64,
}

/// The `p` quantile (0..=1) of sorted values, nearest rank; 0 if empty.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

impl RunReport {
    pub fn new(
        samples: &[Sample],
        events: Vec<ProviderEvents>,
        retries: u64,
        protocol: Protocol,
        rate: u32,
        duration_ms: u64,
    ) -> RunReport {
        let mut latencies: Vec<u64> = samples.iter().map(|s| s.latency_us).collect();
        latencies.sort_unstable();
        let pct = |p: f64| percentile(&latencies, p) as f64 / 1000.0;
        RunReport {
            requests: samples.len() as u64,
            failed: samples.iter().filter(|s| !s.ok).count() as u64,
            after_closing: events.iter().map(|e| e.after_closing).sum(),
            drain_ms: events
                .iter()
                .map(|e| e.drained_ms.saturating_sub(e.closing_ms))
                .collect(),
            retries,
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            max_ms: pct(1.0),
            protocol,
            rate,
            duration_ms,
            events,
            consumer_rss_kb: [0, 0],
            consumer_inflight_end: 0,
        }
    }

    /// One line for the terminal and the closing note.
    pub fn line(&self, name: &str) -> String {
        let drains: Vec<String> = self.drain_ms.iter().map(u64::to_string).collect();
        format!(
            "{name:<8} {} requests, {} failed, {} after closing, drain_ms [{}], {} retries, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.requests,
            self.failed,
            self.after_closing,
            drains.join(", "),
            self.retries,
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

/// The report file: one entry per run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub graceful: RunReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<RunReport>,
}

const BUCKET_MS: u64 = 250;
const COLORS: [&str; 3] = ["#1f77b4", "#2ca02c", "#9467bd"];

/// An SVG with one panel per run: requests per second served by each
/// provider (the final answers the load generator got), in 250 ms buckets,
/// with each shutdown's closing, drained, down and up moments marked.
pub fn chart(runs: &[(&str, &RunReport, &[Sample])]) -> String {
    let (w, panel_h, left, top) = (960.0, 260.0, 60.0, 30.0);
    let plot_w = w - left - 20.0;
    let plot_h = panel_h - top - 40.0;
    let height = panel_h * runs.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (panel, (name, report, samples)) in runs.iter().enumerate() {
        let y0 = panel as f64 * panel_h;
        let span_ms = report.duration_ms.max(1);
        let buckets = (span_ms / BUCKET_MS + 1) as usize;
        let mut counts = vec![[0u64; 3]; buckets];
        let mut failures = vec![0u64; buckets];
        for s in samples.iter() {
            let b = ((s.due_ms / BUCKET_MS) as usize).min(buckets - 1);
            if !s.ok {
                failures[b] += 1;
            } else if (1..=3).contains(&s.served_by) {
                counts[b][usize::from(s.served_by - 1)] += 1;
            }
        }
        let per_sec = 1000.0 / BUCKET_MS as f64;
        let max = counts
            .iter()
            .flat_map(|c| c.iter())
            .chain(failures.iter())
            .copied()
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * per_sec;
        let x = |ms: f64| left + plot_w * ms / span_ms as f64;
        let y = |v: f64| y0 + top + plot_h * (1.0 - v / max);
        svg.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
            y0 + 18.0,
            escape(&report.line(name))
        ));
        svg.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>\n<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n",
            y0 + top,
            y0 + top + plot_h,
            y0 + top + plot_h,
            left + plot_w,
            y0 + top + plot_h
        ));
        svg.push_str(&format!(
            "<text x=\"5\" y=\"{}\">{:.0}/s</text>\n<text x=\"5\" y=\"{}\">0</text>\n",
            y0 + top + 8.0,
            max,
            y0 + top + plot_h
        ));
        let mut sec = 0;
        while sec * 1000 <= span_ms {
            if sec % 5 == 0 {
                svg.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{}\">{sec}s</text>\n",
                    x(sec as f64 * 1000.0) - 6.0,
                    y0 + top + plot_h + 14.0
                ));
            }
            sec += 1;
        }
        for e in &report.events {
            for (ms, color, label) in [
                (e.closing_ms, "#ff7f0e", "closing"),
                (e.drained_ms, "#8c564b", "drained"),
                (e.down_ms, "#d62728", "SIGTERM"),
                (e.up_ms, "#17becf", "back"),
            ] {
                let xm = x(ms as f64);
                svg.push_str(&format!(
                    "<line x1=\"{xm:.1}\" y1=\"{}\" x2=\"{xm:.1}\" y2=\"{}\" stroke=\"{color}\" stroke-dasharray=\"4 3\"/>\n<text x=\"{:.1}\" y=\"{}\" fill=\"{color}\" font-size=\"9\">p{} {label}</text>\n",
                    y0 + top,
                    y0 + top + plot_h,
                    xm + 2.0,
                    y0 + top + 10.0 + 10.0 * (["closing", "drained", "SIGTERM", "back"].iter().position(|l| *l == label).unwrap_or(0) as f64),
                    e.provider
                ));
            }
        }
        for p in 0..3 {
            let points: Vec<String> = counts
                .iter()
                .enumerate()
                .map(|(b, c)| {
                    format!(
                        "{:.1},{:.1}",
                        x((b as u64 * BUCKET_MS) as f64),
                        y(c[p] as f64 * per_sec)
                    )
                })
                .collect();
            svg.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                COLORS[p],
                points.join(" ")
            ));
            svg.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" fill=\"{}\">provider p{}</text>\n",
                left + plot_w - 250.0 + 80.0 * p as f64,
                y0 + panel_h - 8.0,
                COLORS[p],
                p + 1
            ));
        }
        if failures.iter().any(|&f| f > 0) {
            let points: Vec<String> = failures
                .iter()
                .enumerate()
                .map(|(b, f)| {
                    format!(
                        "{:.1},{:.1}",
                        x((b as u64 * BUCKET_MS) as f64),
                        y(*f as f64 * per_sec)
                    )
                })
                .collect();
            svg.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"{}\"/>\n",
                points.join(" ")
            ));
            svg.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" fill=\"#d62728\">failed</text>\n",
                left,
                y0 + panel_h - 8.0
            ));
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(due_ms: u64, ok: bool, served_by: u8) -> Sample {
        Sample {
            due_ms,
            latency_us: 1000 + due_ms,
            ok,
            served_by,
            marked: false,
        }
    }

    #[test]
    fn report_counts_and_percentiles() {
        let samples: Vec<Sample> = (0..100)
            .map(|i| sample(i, i != 50, (i % 3 + 1) as u8))
            .collect();
        let events = vec![ProviderEvents {
            provider: 1,
            closing_ms: 10,
            drained_ms: 3510,
            after_closing: 2,
            ..Default::default()
        }];
        let r = RunReport::new(&samples, events, 7, Protocol::Http1, 500, 100);
        assert_eq!(
            (r.requests, r.failed, r.after_closing, r.retries),
            (100, 1, 2, 7)
        );
        assert_eq!(r.drain_ms, [3500]);
        assert!((r.p50_ms - 1.05).abs() < 0.011, "{}", r.p50_ms);
        assert!(r
            .line("graceful")
            .contains("100 requests, 1 failed, 2 after closing, drain_ms [3500]"));
        let svg = chart(&[("graceful", &r, &samples)]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("p1 closing") && svg.contains(">failed<"));
    }
}
