//! What a rolling-restart run reports, whoever drove it (`make demo`'s
//! processes, the docker harness's containers, `make bench`'s shutdown
//! runs): the numbers ([`RunReport`], the runs of `report.json`) and a
//! chart of requests per second per provider with the shutdown moments
//! ([`chart`]).

use serde::Serialize;

use crate::support::load::{Protocol, Sample};

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
    /// The new instance answered its readiness probe (0 where none came
    /// back: a scale-down).
    pub up_ms: u64,
    /// Requests that reached this provider after `seen_ms` (its access log).
    pub after_closing: u64,
    /// Of the requests this provider received, those the consumer started
    /// after `seen_ms` (whole ms, from both access logs; only where the load
    /// numbers its requests, [`crate::support::load::Shape::numbered`]):
    /// what steering should have kept away. The rest of `after_closing` were
    /// already routed when the consumer saw the provider closing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_after_seen: Option<u64>,
    /// The provider that served the most requests during this shutdown
    /// (closing to [`shutdown_end_ms`]); null if no app answered then.
    pub busiest_provider: Option<usize>,
    /// Its share of the requests answered during this shutdown, 0 to 1: an
    /// even split over two providers left is 0.5, 1.0 is all on one.
    pub max_share: Option<f64>,
    /// Closing to the moment a gRPC health `Watch` held on this provider
    /// since serving learned of it (a message other than SERVING, or the
    /// stream's end or reset, the exit's included); `keepalive_clients` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_told_ms: Option<u64>,
    /// graceful_drain's report of this shutdown (`GET /graceful/report`
    /// once drained); null where the filters did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_report: Option<serde_json::Value>,
    /// When the last request to it ended (behind fronts, from their access
    /// logs); null elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_request_end_ms: Option<u64>,
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
    /// Closing to the process gone (SIGTERM answered) for each provider:
    /// what a shutdown costs the rollout.
    pub gone_ms: Vec<u64>,
    /// The load's long requests (in `requests`, left out of the latencies).
    pub long_requests: u64,
    /// Retries the consumer's Envoy made (`cluster.providers.upstream_rq_retry`).
    pub retries: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The largest of the shutdowns' `max_share`: how much of the traffic
    /// one provider had to carry while another was away.
    pub max_share: Option<f64>,
    pub protocol: Protocol,
    pub rate: u32,
    pub duration_ms: u64,
    pub events: Vec<ProviderEvents>,
    /// Each shutdown's [`ProviderEvents::watch_told_ms`], where a health
    /// watcher ran (empty elsewhere).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub watch_told_ms: Vec<u64>,
    /// The consumer Envoy's resident size when the load started and ended.
    pub consumer_rss_kb: [u64; 2],
    /// The consumer's outbound in-flight gauge after the load (must be 0);
    /// null where the consumer runs no graceful_consumer.
    pub consumer_inflight_end: Option<u64>,
    /// Hosts Envoy's outlier detection ejected on the consumer's
    /// `providers` cluster; null where it is not configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_ejections: Option<u64>,
}

/// The `p` quantile (0..=1) of sorted values, nearest rank; 0 if empty.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

/// When a shutdown ends for [`busiest_share`]: the first request the
/// provider served after it came back (readiness passing is not enough: the
/// registry re-adds it later), or, if it never served again, when it was
/// gone.
fn shutdown_end_ms(samples: &[Sample], ev: &ProviderEvents) -> u64 {
    let back_ms = ev.up_ms.max(ev.down_ms);
    samples
        .iter()
        .filter(|s| usize::from(s.served_by) == ev.provider && s.due_ms >= back_ms)
        .map(|s| s.due_ms)
        .min()
        .unwrap_or(ev.down_ms)
}

/// The provider that served the most of the requests due from `from_ms`
/// to before `to_ms`, and its share of those an app answered (3 decimals);
/// None if no app answered one.
fn busiest_share(samples: &[Sample], from_ms: u64, to_ms: u64) -> Option<(usize, f64)> {
    let mut served = std::collections::BTreeMap::<u8, u64>::new();
    for s in samples {
        if s.served_by > 0 && (from_ms..to_ms).contains(&s.due_ms) {
            *served.entry(s.served_by).or_default() += 1;
        }
    }
    let total: u64 = served.values().sum();
    let (provider, most) = served.into_iter().max_by_key(|&(_, n)| n)?;
    let share = (most as f64 / total as f64 * 1000.0).round() / 1000.0;
    Some((usize::from(provider), share))
}

/// A share as the line and the table print it.
pub(crate) fn share_text(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{s:.3}"))
}

impl RunReport {
    pub fn new(
        samples: &[Sample],
        mut events: Vec<ProviderEvents>,
        retries: u64,
        protocol: Protocol,
        rate: u32,
        duration_ms: u64,
    ) -> RunReport {
        let mut latencies: Vec<u64> = samples
            .iter()
            .filter(|s| !s.long)
            .map(|s| s.latency_us)
            .collect();
        latencies.sort_unstable();
        let pct = |p: f64| percentile(&latencies, p) as f64 / 1000.0;
        for ev in &mut events {
            let busiest = busiest_share(samples, ev.closing_ms, shutdown_end_ms(samples, ev));
            ev.busiest_provider = busiest.map(|(provider, _)| provider);
            ev.max_share = busiest.map(|(_, share)| share);
        }
        RunReport {
            requests: samples.len() as u64,
            failed: samples.iter().filter(|s| !s.ok).count() as u64,
            after_closing: events.iter().map(|e| e.after_closing).sum(),
            drain_ms: events
                .iter()
                .map(|e| e.drained_ms.saturating_sub(e.closing_ms))
                .collect(),
            gone_ms: events
                .iter()
                .map(|e| e.down_ms.saturating_sub(e.closing_ms))
                .collect(),
            watch_told_ms: events.iter().filter_map(|e| e.watch_told_ms).collect(),
            long_requests: samples.iter().filter(|s| s.long).count() as u64,
            retries,
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            max_ms: pct(1.0),
            max_share: events.iter().filter_map(|e| e.max_share).reduce(f64::max),
            protocol,
            rate,
            duration_ms,
            events,
            consumer_rss_kb: [0, 0],
            consumer_inflight_end: None,
            outlier_ejections: None,
        }
    }

    /// One line for the terminal and the closing note.
    pub fn line(&self, name: &str) -> String {
        let drains: Vec<String> = self.drain_ms.iter().map(u64::to_string).collect();
        let gone: Vec<String> = self.gone_ms.iter().map(u64::to_string).collect();
        let watch = if self.watch_told_ms.is_empty() {
            String::new()
        } else {
            let told: Vec<String> = self.watch_told_ms.iter().map(u64::to_string).collect();
            format!(", health Watch told after [{}] ms", told.join(", "))
        };
        let ejected = self
            .outlier_ejections
            .map_or(String::new(), |n| format!(", {n} outlier ejections"));
        format!(
            "{name:<8} {} requests, {} failed, {} after closing, drain_ms [{}], gone_ms [{}], {} retries, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, max share {}{watch}{ejected}",
            self.requests,
            self.failed,
            self.after_closing,
            drains.join(", "),
            gone.join(", "),
            self.retries,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            share_text(self.max_share),
        )
    }

    /// Closing to the process gone, mean over the shutdowns, in seconds.
    pub fn mean_gone_s(&self) -> f64 {
        if self.gone_ms.is_empty() {
            0.0
        } else {
            self.gone_ms.iter().sum::<u64>() as f64 / self.gone_ms.len() as f64 / 1000.0
        }
    }
}

const BUCKET_MS: u64 = 250;
const COLORS: [&str; 3] = ["#1f77b4", "#2ca02c", "#9467bd"];

/// An SVG with one panel per run: requests per second served by each
/// provider (the final answers the load generator got), in 250 ms buckets,
/// with each shutdown's closing, drained, down and up moments marked.
pub fn chart(runs: &[(&str, &RunReport, &[Sample])]) -> String {
    let height = PANEL_H * runs.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (panel, (name, report, samples)) in runs.iter().enumerate() {
        let p = Panel::new(panel, report, samples);
        p.frame(&mut svg, &report.line(name));
        p.time_axis(&mut svg);
        p.shutdown_marks(&mut svg, &report.events);
        p.provider_lines(&mut svg);
        p.failure_line(&mut svg);
    }
    svg.push_str("</svg>\n");
    svg
}

const CHART_W: f64 = 960.0;
const PANEL_H: f64 = 260.0;
const PANEL_LEFT: f64 = 60.0;
const PANEL_TOP: f64 = 30.0;

/// One run's panel of [`chart`]: its place in the drawing and its
/// per-bucket counts.
struct Panel {
    y0: f64,
    span_ms: u64,
    plot_w: f64,
    plot_h: f64,
    /// Answers served per bucket, by provider p1..p3.
    counts: Vec<[u64; 3]>,
    failures: Vec<u64>,
    /// The y axis' top, in requests per second.
    max: f64,
}

impl Panel {
    fn new(panel: usize, report: &RunReport, samples: &[Sample]) -> Panel {
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
        let max = counts
            .iter()
            .flat_map(|c| c.iter())
            .chain(failures.iter())
            .copied()
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * Panel::PER_SEC;
        Panel {
            y0: panel as f64 * PANEL_H,
            span_ms,
            plot_w: CHART_W - PANEL_LEFT - 20.0,
            plot_h: PANEL_H - PANEL_TOP - 40.0,
            counts,
            failures,
            max,
        }
    }

    /// Buckets per second.
    const PER_SEC: f64 = 1000.0 / BUCKET_MS as f64;

    fn x(&self, ms: f64) -> f64 {
        PANEL_LEFT + self.plot_w * ms / self.span_ms as f64
    }

    fn y(&self, v: f64) -> f64 {
        self.y0 + PANEL_TOP + self.plot_h * (1.0 - v / self.max)
    }

    /// The bottom of the plot.
    fn base(&self) -> f64 {
        self.y0 + PANEL_TOP + self.plot_h
    }

    /// The title, the axes and the y scale.
    fn frame(&self, svg: &mut String, title: &str) {
        let (left, top) = (PANEL_LEFT, self.y0 + PANEL_TOP);
        svg.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
            self.y0 + 18.0,
            escape(title)
        ));
        svg.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>\n<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n",
            self.base(),
            self.base(),
            left + self.plot_w,
            self.base()
        ));
        svg.push_str(&format!(
            "<text x=\"5\" y=\"{}\">{:.0}/s</text>\n<text x=\"5\" y=\"{}\">0</text>\n",
            top + 8.0,
            self.max,
            self.base()
        ));
    }

    /// A label every 5 s.
    fn time_axis(&self, svg: &mut String) {
        let mut sec = 0;
        while sec * 1000 <= self.span_ms {
            if sec % 5 == 0 {
                svg.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{}\">{sec}s</text>\n",
                    self.x(sec as f64 * 1000.0) - 6.0,
                    self.base() + 14.0
                ));
            }
            sec += 1;
        }
    }

    /// Each shutdown's closing, drained, SIGTERM and back moments.
    fn shutdown_marks(&self, svg: &mut String, events: &[ProviderEvents]) {
        let top = self.y0 + PANEL_TOP;
        for e in events {
            for (row, (ms, color, label)) in [
                (e.closing_ms, "#ff7f0e", "closing"),
                (e.drained_ms, "#8c564b", "drained"),
                (e.down_ms, "#d62728", "SIGTERM"),
                (e.up_ms, "#17becf", "back"),
            ]
            .into_iter()
            .enumerate()
            {
                let xm = self.x(ms as f64);
                svg.push_str(&format!(
                    "<line x1=\"{xm:.1}\" y1=\"{top}\" x2=\"{xm:.1}\" y2=\"{}\" stroke=\"{color}\" stroke-dasharray=\"4 3\"/>\n<text x=\"{:.1}\" y=\"{}\" fill=\"{color}\" font-size=\"9\">p{} {label}</text>\n",
                    self.base(),
                    xm + 2.0,
                    top + 10.0 + 10.0 * row as f64,
                    e.provider
                ));
            }
        }
    }

    /// `points` per bucket as a polyline's points.
    fn polyline_points(&self, per_bucket: impl Iterator<Item = u64>) -> String {
        per_bucket
            .enumerate()
            .map(|(b, n)| {
                format!(
                    "{:.1},{:.1}",
                    self.x((b as u64 * BUCKET_MS) as f64),
                    self.y(n as f64 * Panel::PER_SEC)
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Each provider's answers per second, with its legend.
    fn provider_lines(&self, svg: &mut String) {
        for (p, color) in COLORS.iter().enumerate() {
            svg.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                self.polyline_points(self.counts.iter().map(|c| c[p]))
            ));
            svg.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" fill=\"{color}\">provider p{}</text>\n",
                PANEL_LEFT + self.plot_w - 250.0 + 80.0 * p as f64,
                self.y0 + PANEL_H - 8.0,
                p + 1
            ));
        }
    }

    /// Failed requests per second, where there are any.
    fn failure_line(&self, svg: &mut String) {
        if self.failures.iter().all(|&f| f == 0) {
            return;
        }
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"{}\"/>\n",
            self.polyline_points(self.failures.iter().copied())
        ));
        svg.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" fill=\"#d62728\">failed</text>\n",
            PANEL_LEFT,
            self.y0 + PANEL_H - 8.0
        ));
    }
}

/// An SVG path's `d` through `points` (already in the drawing's
/// coordinates): a move to the first, a line to each next.
pub(crate) fn path_data(points: impl IntoIterator<Item = (f64, f64)>) -> String {
    points
        .into_iter()
        .enumerate()
        .map(|(i, (x, y))| format!("{}{x:.1},{y:.1}", if i == 0 { "M" } else { " L" }))
        .collect()
}

/// Text for an SVG `<text>` element.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Runs for the tests here and in the demo's matrix report.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub(crate) fn sample(due_ms: u64, ok: bool, served_by: u8) -> Sample {
        Sample {
            due_ms,
            latency_us: 1000 + due_ms,
            ok,
            served_by,
            marked: false,
            long: false,
        }
    }

    /// Provider 1 closes at 1000 ms, is gone at 2000, ready at 2500 and
    /// serves again from 3000 (the registry's lag); `during` says who serves
    /// each request due from closing until then.
    pub(crate) fn one_shutdown(during: impl Fn(u64) -> u8) -> RunReport {
        let samples: Vec<Sample> = (0..4000)
            .step_by(10)
            .map(|due_ms| {
                let served_by = if (1000..3000).contains(&due_ms) {
                    during(due_ms)
                } else {
                    (due_ms / 10 % 3 + 1) as u8
                };
                sample(due_ms, true, served_by)
            })
            .collect();
        let events = vec![ProviderEvents {
            provider: 1,
            closing_ms: 1000,
            drained_ms: 1500,
            down_ms: 2000,
            up_ms: 2500,
            ..Default::default()
        }];
        RunReport::new(&samples, events, 0, Protocol::Http1, 100, 4000)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{one_shutdown, sample};
    use super::*;

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
            .contains("100 requests, 1 failed, 2 after closing, drain_ms [3500], gone_ms [0]"));
        let svg = chart(&[("graceful", &r, &samples)]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("p1 closing") && svg.contains(">failed<"));
    }

    #[test]
    fn max_share_is_the_busiest_providers_share_while_one_is_away() {
        // Even: the two left alternate, each half of the load.
        let even = one_shutdown(|due_ms| (due_ms / 10 % 2 + 2) as u8);
        assert_eq!(even.events[0].max_share, Some(0.5));
        assert_eq!(even.max_share, Some(0.5));
        assert!(even.line("graceful").ends_with("max share 0.500"));
        // Piled onto one: provider 3 takes everything.
        let piled = one_shutdown(|_| 3);
        assert_eq!(
            (piled.events[0].busiest_provider, piled.max_share),
            (Some(3), Some(1.0))
        );
        // Uneven, 3 in 4 on provider 2; the run's value is its worst shutdown.
        let uneven = one_shutdown(|due_ms| if due_ms % 40 == 0 { 3 } else { 2 });
        assert_eq!(uneven.max_share, Some(0.75));
    }

    #[test]
    fn a_shutdown_without_a_return_ends_when_the_provider_is_gone() {
        // Provider 1 never serves again: the window is closing to gone
        // (1000..2000), where 2 and 3 split evenly; after it, 2 takes all.
        let samples: Vec<Sample> = (0..4000)
            .step_by(10)
            .map(|due_ms| {
                let served_by = match due_ms {
                    0..1000 => (due_ms / 10 % 3 + 1) as u8,
                    1000..2000 => (due_ms / 10 % 2 + 2) as u8,
                    _ => 2,
                };
                sample(due_ms, true, served_by)
            })
            .collect();
        let events = vec![ProviderEvents {
            provider: 1,
            closing_ms: 1000,
            down_ms: 2000,
            ..Default::default()
        }];
        let r = RunReport::new(&samples, events, 0, Protocol::Http1, 100, 4000);
        assert_eq!(r.max_share, Some(0.5));
        // No answered request at all: nothing to share.
        let failed: Vec<Sample> = (0..100).map(|i| sample(i * 10, false, 0)).collect();
        let none = RunReport::new(&failed, r.events.clone(), 0, Protocol::Http1, 100, 1000);
        assert_eq!(
            (none.max_share, none.line("x").ends_with("max share -")),
            (None, true)
        );
    }
}
