//! An SVG of dashboard panels: one small line chart per panel, each line a
//! series a range query returned. What the Prometheus suite draws of the
//! Grafana dashboard's queries over a real run (`docs/operations/dashboard.svg`):
//! the panels' data, not Grafana's rendering of them.

use crate::support::run_report::{escape, path_data};

/// One panel: its title and its series, each a legend and (seconds since
/// the run's start, value) points.
pub struct PanelData {
    pub title: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

/// Two panels a row, `span_s` seconds wide each.
pub fn panels_chart(title: &str, panels: &[PanelData], span_s: f64) -> String {
    let (panel_w, panel_h, gap, top) = (460.0, 200.0, 20.0, 40.0);
    let rows = panels.len().div_ceil(2);
    let w = 2.0 * panel_w + 3.0 * gap;
    let h = top + rows as f64 * (panel_h + gap);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{gap}\" y=\"24\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    for (i, panel) in panels.iter().enumerate() {
        let x0 = gap + (i % 2) as f64 * (panel_w + gap);
        let y0 = top + (i / 2) as f64 * (panel_h + gap);
        let (left, plot_top, plot_w, plot_h) =
            (x0 + 40.0, y0 + 20.0, panel_w - 50.0, panel_h - 60.0);
        let max = panel
            .series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, v)| *v))
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(1.0);
        let x = |s: f64| left + plot_w * (s / span_s).clamp(0.0, 1.0);
        let y = |v: f64| plot_top + plot_h * (1.0 - (v / max).clamp(0.0, 1.0));
        svg.push_str(&format!(
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{panel_w}\" height=\"{panel_h}\" fill=\"none\" stroke=\"#ccc\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>\n",
            x0 + 6.0,
            y0 + 13.0,
            escape(&panel.title)
        ));
        svg.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{plot_top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"#333\"/>\n<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#333\"/>\n<text x=\"{2:.1}\" y=\"{3:.1}\">{max:.3}</text>\n<text x=\"{2:.1}\" y=\"{0:.1}\">0</text>\n<text x=\"{left:.1}\" y=\"{4:.1}\">0s</text>\n<text x=\"{5:.1}\" y=\"{4:.1}\">{span_s:.0}s</text>\n",
            plot_top + plot_h,
            left + plot_w,
            x0 + 4.0,
            plot_top + 8.0,
            plot_top + plot_h + 12.0,
            left + plot_w - 14.0,
        ));
        for (j, (legend, points)) in panel.series.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let d = path_data(
                points
                    .iter()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(s, v)| (x(*s), y(*v))),
            );
            svg.push_str(&format!(
                "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.8\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{}</text>\n",
                left + (j % 3) as f64 * 140.0,
                plot_top + plot_h + 26.0 + (j / 3) as f64 * 12.0,
                escape(legend)
            ));
        }
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_panel_per_query_and_a_line_per_series() {
        let panels = [
            PanelData {
                title: "phase <pods>".into(),
                series: vec![
                    ("a".into(), vec![(0.0, 0.0), (5.0, 2.0)]),
                    ("b".into(), vec![(0.0, 0.0), (5.0, f64::NAN), (6.0, 1.0)]),
                ],
            },
            PanelData {
                title: "empty".into(),
                series: vec![],
            },
        ];
        let svg = panels_chart("t", &panels, 10.0);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("phase &lt;pods&gt;"));
        assert!(!svg.contains("NaN"));
    }
}
