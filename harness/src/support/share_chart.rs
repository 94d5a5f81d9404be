//! An SVG of one host's share of requests over time, one line per run,
//! beside the share a formula expects (dashed): what the slow-start suite
//! measures of a readmitted instance (`docs/slow-start.svg`).

use crate::support::run_report::{escape, path_data};

/// One measured run: its label, colour and (seconds, share 0..1) points.
pub struct ShareSeries<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

/// The chart: `runs` as solid lines, `expected` as a dashed one, over
/// `span_s` seconds, a vertical mark at `mark_s` (labelled `mark`).
pub fn share_chart(
    title: &str,
    runs: &[ShareSeries],
    expected: (&str, &[(f64, f64)]),
    span_s: f64,
    mark: (&str, f64),
) -> String {
    let (w, h, left, top, bottom) = (760.0, 360.0, 60.0, 40.0, 70.0);
    let plot_w = w - left - 20.0;
    let plot_h = h - top - bottom;
    let x = |s: f64| left + plot_w * (s / span_s).clamp(0.0, 1.0);
    let y = |share: f64| top + plot_h * (1.0 - (share / 0.5).clamp(0.0, 1.0));
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"20\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    svg.push_str(&format!(
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"#333\"/>\n<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#333\"/>\n",
        top + plot_h,
        left + plot_w
    ));
    for pct in [0, 10, 20, 30, 40, 50] {
        let yy = y(f64::from(pct) / 100.0);
        svg.push_str(&format!(
            "<text x=\"20\" y=\"{:.1}\">{pct}%</text>\n<line x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#eee\"/>\n",
            yy + 4.0,
            left + plot_w
        ));
    }
    let mut sec = 0.0;
    while sec <= span_s {
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{sec:.0}s</text>\n",
            x(sec) - 6.0,
            top + plot_h + 14.0
        ));
        sec += 1.0;
    }
    let (mark_label, mark_s) = mark;
    svg.push_str(&format!(
        "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"#999\" stroke-dasharray=\"2,3\"/>\n<text x=\"{2:.1}\" y=\"{3:.1}\" fill=\"#666\">{4}</text>\n",
        x(mark_s),
        top + plot_h,
        x(mark_s) + 4.0,
        top + 12.0,
        escape(mark_label)
    ));
    let path = |points: &[(f64, f64)]| path_data(points.iter().map(|(s, v)| (x(*s), y(*v))));
    let (expected_label, expected_points) = expected;
    svg.push_str(&format!(
        "<path d=\"{}\" fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
        path(expected_points)
    ));
    for r in runs {
        svg.push_str(&format!(
            "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
            path(r.points),
            r.color
        ));
    }
    let legend_y = top + plot_h + 34.0;
    let mut lx = left;
    for (label, color, dash) in runs
        .iter()
        .map(|r| (r.label, r.color, ""))
        .chain(std::iter::once((expected_label, "#555", "6,4")))
    {
        svg.push_str(&format!(
            "<line x1=\"{lx:.1}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n<text x=\"{2:.1}\" y=\"{3:.1}\">{4}</text>\n",
            legend_y,
            lx + 24.0,
            lx + 30.0,
            legend_y + 4.0,
            escape(label)
        ));
        lx += 40.0 + 6.5 * label.len() as f64;
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_run_and_the_expected_line() {
        let on = [(0.0, 0.05), (3.0, 0.2), (6.0, 0.33)];
        let off = [(0.0, 0.33), (6.0, 0.33)];
        let svg = share_chart(
            "a <title>",
            &[
                ShareSeries {
                    label: "on",
                    color: "#1f77b4",
                    points: &on,
                },
                ShareSeries {
                    label: "off",
                    color: "#d62728",
                    points: &off,
                },
            ],
            ("Envoy", &on),
            8.0,
            ("window ends", 6.0),
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<path").count(), 3);
        assert!(svg.contains("a &lt;title&gt;"));
        assert!(svg.contains(">window ends<"));
    }
}
