//! Inline SVG charts for the load report: lines over time and grouped bars. No scripts, fonts
//! or files beside the page: each chart is one `<svg class="chart">` element.

use std::fmt::Write;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 250.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 40.0;

/// Distinct colours for series and runs, in order.
const PALETTE: [&str; 6] = [
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
];

/// The colour of the `index`-th series or run.
pub(crate) fn color(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

/// One line of a line chart.
pub(crate) struct Series {
    pub name: String,
    /// (x, y) points in x order.
    pub points: Vec<(f64, f64)>,
    /// Index into the palette.
    pub color: usize,
    pub dashed: bool,
}

/// One group of bars of a bar chart: a value per run (`None`: that run has no such case).
pub(crate) struct BarGroup {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Text for SVG and HTML: `&`, `<`, `>` and quotes escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// `value` with a unit suffix and few digits: 950, 12.5k, 1.25M.
pub(crate) fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{}M", without_trailing_zeros(value / 1e6, 2))
    } else if magnitude >= 1e3 {
        format!("{}k", without_trailing_zeros(value / 1e3, 1))
    } else if magnitude >= 10.0 {
        without_trailing_zeros(value, 1)
    } else {
        without_trailing_zeros(value, 2)
    }
}

/// `value` with at most `decimals` decimals, and none that are trailing zeros.
fn without_trailing_zeros(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten at or above `value` (1 for nothing).
fn nice_ceiling(value: f64) -> f64 {
    if value.is_nan() || value <= 0.0 || value.is_infinite() {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|step| step * power)
        .find(|candidate| *candidate >= value * 0.999_999)
        .unwrap_or(10.0 * power)
}

/// The start every chart shares: the element, its title, the y unit and the legend.
fn open_chart(svg: &mut String, title: &str, y_unit: &str, legend: &[(String, usize, bool)]) {
    let _ = write!(
        svg,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img"><title>{}</title>"#,
        escape(title)
    );
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="16" class="title">{}</text><text x="4" y="{}" class="unit">{}</text>"#,
        escape(title),
        TOP - 8.0,
        escape(y_unit)
    );
    let mut x = LEFT;
    for (name, color_index, dashed) in legend {
        let dash = if *dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            svg,
            r#"<line x1="{x}" y1="27" x2="{}" y2="27" stroke="{}" stroke-width="3"{dash}/><text x="{}" y="31" class="legend">{}</text>"#,
            x + 16.0,
            color(*color_index),
            x + 20.0,
            escape(name)
        );
        x += 34.0 + 7.0 * name.chars().count() as f64;
    }
}

/// Horizontal grid lines with their values, from 0 to `y_top` (a `nice_ceiling`), in steps
/// that are round numbers: a quarter of a top of 2 (0.5), a fifth of 1, 2.5, 5 or 10.
fn y_grid(svg: &mut String, y_top: f64) {
    let mantissa = y_top / 10f64.powf(y_top.log10().floor());
    let steps: u32 = if (mantissa - 2.0).abs() < 1e-9 { 4 } else { 5 };
    let plot_height = HEIGHT - TOP - BOTTOM;
    for step in 0..=steps {
        let value = y_top * f64::from(step) / f64::from(steps);
        let y = HEIGHT - BOTTOM - plot_height * f64::from(step) / f64::from(steps);
        let _ = write!(
            svg,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" class="axis" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            short_number(value)
        );
    }
}

/// A line chart of `series` against x (`x_unit` names it), from 0 to the largest x and y.
pub(crate) fn line_chart(title: &str, x_unit: &str, y_unit: &str, series: &[Series]) -> String {
    let mut svg = String::new();
    let legend: Vec<(String, usize, bool)> = series
        .iter()
        .map(|line| (line.name.clone(), line.color, line.dashed))
        .collect();
    open_chart(&mut svg, title, y_unit, &legend);
    let points = series.iter().flat_map(|line| line.points.iter());
    let (x_max, y_max) = points.fold((0.0f64, 0.0f64), |(x_max, y_max), (x, y)| {
        (x_max.max(*x), y_max.max(*y))
    });
    let x_right = nice_ceiling(x_max);
    let y_top = nice_ceiling(y_max);
    y_grid(&mut svg, y_top);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    for step in 0..=4 {
        let value = x_right * f64::from(step) / 4.0;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{}" class="axis" text-anchor="middle">{}</text>"#,
            LEFT + plot_width * f64::from(step) / 4.0,
            HEIGHT - BOTTOM + 16.0,
            short_number(value)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 6.0,
        escape(x_unit)
    );
    for line in series {
        let on_screen: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|(x, y)| {
                (
                    LEFT + plot_width * x / x_right,
                    HEIGHT - BOTTOM - plot_height * y / y_top,
                )
            })
            .collect();
        let coordinates: Vec<String> = on_screen
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let dash = if line.dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            color(line.color),
            coordinates.join(" ")
        );
        // A lone point draws no line: mark it.
        if let [(x, y)] = on_screen[..] {
            let _ = write!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                color(line.color)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Grouped bars: one group per case, one bar per run (named by `bar_names`, coloured in order).
pub(crate) fn bar_chart(
    title: &str,
    y_unit: &str,
    bar_names: &[String],
    groups: &[BarGroup],
) -> String {
    let mut svg = String::new();
    let legend: Vec<(String, usize, bool)> = bar_names
        .iter()
        .enumerate()
        .map(|(index, name)| (name.clone(), index, false))
        .collect();
    open_chart(&mut svg, title, y_unit, &legend);
    let y_max = groups
        .iter()
        .flat_map(|group| group.values.iter().flatten())
        .fold(0.0f64, |max, value| max.max(*value));
    let y_top = nice_ceiling(y_max);
    y_grid(&mut svg, y_top);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let group_width = plot_width / groups.len().max(1) as f64;
    let bar_width = (group_width * 0.8) / bar_names.len().max(1) as f64;
    for (group_index, group) in groups.iter().enumerate() {
        let group_left = LEFT + group_width * group_index as f64 + group_width * 0.1;
        for (bar_index, value) in group.values.iter().enumerate() {
            let Some(value) = value else { continue };
            let height = plot_height * value / y_top;
            let x = group_left + bar_width * bar_index as f64;
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                HEIGHT - BOTTOM - height,
                (bar_width - 2.0).max(1.0),
                color(bar_index),
                escape(&bar_names[bar_index.min(bar_names.len().saturating_sub(1))]),
                short_number(*value)
            );
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" class="value" text-anchor="middle">{}</text>"#,
                x + bar_width / 2.0 - 1.0,
                HEIGHT - BOTTOM - height - 3.0,
                short_number(*value)
            );
        }
        // A group's name breaks at " · " into lines under its bars.
        let x = LEFT + group_width * (group_index as f64 + 0.5);
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{}" class="axis" text-anchor="middle">"#,
            HEIGHT - BOTTOM + 4.0
        );
        for part in group.name.split(" · ") {
            let _ = write!(svg, r#"<tspan x="{x:.1}" dy="11">{}</tspan>"#, escape(part));
        }
        svg.push_str("</text>");
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_and_numbers_read_well() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(f64::NAN), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(2.0), 2.0);
        assert_eq!(nice_ceiling(2.2), 2.5);
        assert_eq!(nice_ceiling(41_000.0), 50_000.0);
        assert_eq!(short_number(950.0), "950");
        assert_eq!(short_number(12.5), "12.5");
        assert_eq!(short_number(12_500.0), "12.5k");
        assert_eq!(short_number(50_000.0), "50k");
        assert_eq!(short_number(1_250_000.0), "1.25M");
        assert_eq!(short_number(2_000_000.0), "2M");
        assert_eq!(short_number(2.5), "2.5");
        assert_eq!(short_number(0.0), "0");
    }

    #[test]
    fn charts_escape_names_and_scale_points_into_the_frame() {
        let chart = line_chart(
            "ops/s <create>",
            "seconds",
            "ops/s",
            &[Series {
                name: "a&b".into(),
                points: vec![(1.0, 10.0), (2.0, 20.0)],
                color: 0,
                dashed: false,
            }],
        );
        assert!(chart.starts_with(r#"<svg class="chart""#), "{chart}");
        assert!(chart.contains("ops/s &lt;create&gt;"), "{chart}");
        assert!(chart.contains(">a&amp;b<"), "{chart}");
        // x runs to 2 and y to 20: the last point sits at the top right corner of the plot.
        assert!(
            chart.contains(&format!("{:.1},{:.1}\"", WIDTH - RIGHT, TOP)),
            "{chart}"
        );
        let bars = bar_chart(
            "p99",
            "ms",
            &["before".into(), "after".into()],
            &[BarGroup {
                name: "create".into(),
                values: vec![Some(4.0), None],
            }],
        );
        assert_eq!(bars.matches("<rect").count(), 1, "{bars}");
        assert!(bars.contains("<title>before: 4</title>"), "{bars}");
    }
}
