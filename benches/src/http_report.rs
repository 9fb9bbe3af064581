//! The load report: one self-contained HTML page (inline SVG and CSS, nothing fetched) showing
//! one or several runs of `concord-bench http`: a summary table, throughput and p50/p99 over
//! time for each case, and, given several runs (this one and earlier runs' output files, or
//! only files), bar charts of the same cases side by side, so that two builds or two settings
//! compare by looking.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::http_result::{HttpResult, human_latency};
use crate::report::human_rate;
use crate::svg_chart::{self, BarGroup, Series, escape, line_chart};

/// The cases of one run, under the name the report gives it.
pub struct ReportRun {
    /// The run's `--label`; empty: unnamed.
    pub label: String,
    /// Its cases, in the order they ran.
    pub results: Vec<HttpResult>,
}

/// Earlier runs from their output: each file is what `concord-bench http` printed (the whole
/// output or only its JSON lines). A run is named by the `--label` it was given, else by its
/// file's name.
pub fn read_runs(paths: &[PathBuf]) -> Result<Vec<ReportRun>, String> {
    paths.iter().map(|path| read_run(path)).collect()
}

fn read_run(path: &Path) -> Result<ReportRun, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let mut results = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(line).map_err(|error| {
            format!(
                "{}:{}: not a JSON line: {error}",
                path.display(),
                number + 1
            )
        })?;
        let is_http_case = value
            .get("case")
            .and_then(|case| case.as_str())
            .is_some_and(|case| case.starts_with("http_"));
        if !is_http_case {
            continue;
        }
        let result: HttpResult = serde_json::from_value(value).map_err(|error| {
            format!(
                "{}:{}: not a concord-bench http result: {error}",
                path.display(),
                number + 1
            )
        })?;
        results.push(result);
    }
    if results.is_empty() {
        return Err(format!(
            "{} holds no concord-bench http result (JSON lines with \"case\": \"http_...\")",
            path.display()
        ));
    }
    let label = match results.iter().find(|result| !result.label.is_empty()) {
        Some(result) => result.label.clone(),
        None => path.file_stem().map_or_else(
            || path.display().to_string(),
            |stem| stem.to_string_lossy().into(),
        ),
    };
    Ok(ReportRun { label, results })
}

/// Writes the page for `runs` to `path`.
pub fn write_report(path: &Path, title: &str, runs: &[ReportRun]) -> std::io::Result<()> {
    std::fs::write(path, render(title, runs))
}

/// What identifies a case across runs: the workload, the connections, and the loop.
/// (Its parts are separated by " · ", where a chart's axis may break the line.)
fn case_key(result: &HttpResult) -> String {
    let workload = result.case.trim_start_matches("http_");
    match result.target_rate_per_sec {
        Some(rate) if result.mode == "open" => format!(
            "{workload} · {} conn · {}/s open",
            result.connections,
            human_rate(rate)
        ),
        _ => format!("{workload} · {} conn", result.connections),
    }
}

/// Each run's display name: its label, or "this run" for an unnamed first run.
fn run_names(runs: &[ReportRun]) -> Vec<String> {
    runs.iter()
        .enumerate()
        .map(|(index, run)| match run.label.as_str() {
            "" if index == 0 => "this run".to_string(),
            "" => format!("run {}", index + 1),
            label => label.to_string(),
        })
        .collect()
}

/// The page.
fn render(title: &str, runs: &[ReportRun]) -> String {
    let names = run_names(runs);
    let mut keys: Vec<String> = Vec::new();
    for result in runs.iter().flat_map(|run| &run.results) {
        let key = case_key(result);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut page = String::new();
    let _ = write!(
        page,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #111827; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 28px 0 8px; }}
h3 {{ font-size: 15px; margin: 18px 0 6px; }}
.meta {{ color: #4b5563; margin: 0 0 12px; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: 3px 10px; border-bottom: 1px solid #e5e7eb; text-align: right; }}
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) {{ text-align: left; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }}
svg.chart {{ background: #f9fafb; border: 1px solid #e5e7eb; }}
svg .title {{ font-size: 13px; font-weight: 600; }} svg .unit, svg .legend {{ font-size: 11px; }}
svg .axis, svg .value {{ font-size: 10px; fill: #374151; }} svg .grid {{ stroke: #e5e7eb; }}
.bad {{ color: #b91c1c; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="meta">{runs}. Latency is from the send in closed loop and from the due time in open loop;
server CPU per operation is the server's user + system time over the case divided by the
operations answered.</p>
"#,
        title = escape(title),
        runs = names
            .iter()
            .zip(runs)
            .map(|(name, run)| format!("{} ({} cases)", escape(name), run.results.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    summary_table(&mut page, runs, &names);
    if runs.len() > 1 {
        side_by_side(&mut page, runs, &names, &keys);
    }
    over_time(&mut page, runs, &names, &keys);
    // Marks how many charts laid out with a size, so that a headless browser can tell that
    // the page rendered (the report's own test reads it).
    page.push_str(
        "<script>addEventListener('load', () => { document.body.dataset.chartsDrawn = \
         [...document.querySelectorAll('svg.chart')].filter(chart => { const box = \
         chart.getBBox(); return box.width > 0 && box.height > 0; }).length; });</script>\n",
    );
    page.push_str("</body></html>\n");
    page
}

fn summary_table(page: &mut String, runs: &[ReportRun], names: &[String]) {
    page.push_str(
        "<h2>Summary</h2><table><tr><th>run</th><th>case</th><th>ops/s</th><th>p50</th>\
         <th>p99</th><th>p99.9</th><th>max</th><th>errors</th><th>server CPU/op</th>\
         <th>server RSS</th></tr>\n",
    );
    for (name, run) in names.iter().zip(runs) {
        for result in &run.results {
            let errors = result.errors();
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td{}>{}</td><td>{}</td><td>{}</td></tr>",
                escape(name),
                escape(&case_key(result)),
                human_rate(result.ops_per_sec),
                human_latency(result.p50_us),
                human_latency(result.p99_us),
                human_latency(result.p999_us),
                human_latency(result.max_us),
                if errors > 0 { r#" class="bad""# } else { "" },
                errors,
                result
                    .server_cpu_us_per_op
                    .map_or("–".to_string(), |us| format!("{us:.1} µs")),
                match (
                    result.server_rss_before_bytes,
                    result.server_rss_after_bytes
                ) {
                    (Some(before), Some(after)) =>
                        format!("{} → {} MiB", before >> 20, after >> 20),
                    _ => "–".to_string(),
                }
            );
        }
    }
    page.push_str("</table>\n");
}

/// Bar charts of throughput, p99 and server CPU per operation: a group per case, a bar per run.
fn side_by_side(page: &mut String, runs: &[ReportRun], names: &[String], keys: &[String]) {
    let figure = |pick: &dyn Fn(&HttpResult) -> Option<f64>| -> Vec<BarGroup> {
        keys.iter()
            .map(|key| BarGroup {
                name: key.clone(),
                values: runs
                    .iter()
                    .map(|run| {
                        run.results
                            .iter()
                            .find(|result| case_key(result) == *key)
                            .and_then(pick)
                    })
                    .collect(),
            })
            .collect()
    };
    page.push_str("<h2>Side by side</h2><div class=\"charts\">\n");
    let throughput = figure(&|result| Some(result.ops_per_sec));
    page.push_str(&svg_chart::bar_chart(
        "Throughput",
        "ops/s",
        names,
        &throughput,
    ));
    let p99 = figure(&|result| Some(result.p99_us as f64 / 1000.0));
    page.push_str(&svg_chart::bar_chart("p99 latency", "ms", names, &p99));
    let cpu = figure(&|result| result.server_cpu_us_per_op);
    if cpu
        .iter()
        .any(|group| group.values.iter().any(Option::is_some))
    {
        page.push_str(&svg_chart::bar_chart(
            "Server CPU per operation",
            "µs",
            names,
            &cpu,
        ));
    }
    page.push_str("</div>\n");
}

/// For each case: throughput and latency per second, a line per run.
fn over_time(page: &mut String, runs: &[ReportRun], names: &[String], keys: &[String]) {
    page.push_str("<h2>Over time</h2>\n");
    for key in keys {
        let mut throughput = Vec::new();
        let mut latency = Vec::new();
        let mut memory = Vec::new();
        for (index, (name, run)) in names.iter().zip(runs).enumerate() {
            let Some(result) = run.results.iter().find(|result| case_key(result) == *key) else {
                continue;
            };
            let points = |pick: &dyn Fn(&crate::http_result::LoadSecond) -> f64| {
                result
                    .timeline
                    .iter()
                    .map(|second| (second.at_secs, pick(second)))
                    .collect::<Vec<_>>()
            };
            let prefix = if runs.len() > 1 {
                format!("{name} ")
            } else {
                String::new()
            };
            throughput.push(Series {
                name: format!("{prefix}ops/s"),
                points: points(&|second| second.ops_per_sec),
                color: index,
                dashed: false,
            });
            latency.push(Series {
                name: format!("{prefix}p99"),
                points: points(&|second| second.p99_us as f64 / 1000.0),
                color: index,
                dashed: false,
            });
            latency.push(Series {
                name: format!("{prefix}p50"),
                points: points(&|second| second.p50_us as f64 / 1000.0),
                color: index,
                dashed: true,
            });
            let rss_mib: Vec<(f64, f64)> = result
                .timeline
                .iter()
                .filter_map(|second| {
                    let bytes = second.server_rss_bytes?;
                    Some((second.at_secs, bytes as f64 / (1024.0 * 1024.0)))
                })
                .collect();
            if !rss_mib.is_empty() {
                memory.push(Series {
                    name: format!("{prefix}server RSS"),
                    points: rss_mib,
                    color: index,
                    dashed: false,
                });
            }
        }
        let _ = writeln!(page, "<h3>{}</h3><div class=\"charts\">", escape(key));
        page.push_str(&line_chart("Throughput", "seconds", "ops/s", &throughput));
        page.push_str(&line_chart(
            "Latency (p99 solid, p50 dashed)",
            "seconds",
            "ms",
            &latency,
        ));
        if !memory.is_empty() {
            page.push_str(&line_chart("Server memory", "seconds", "MiB", &memory));
        }
        page.push_str("</div>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_result::LoadSecond;

    fn result(label: &str, connections: u64, ops_per_sec: f64) -> HttpResult {
        serde_json::from_value(serde_json::json!({
            "label": label, "case": "http_create", "connections": connections,
            "ops": 100, "requests": 100, "errors_by_status": {}, "first_error": null,
            "seconds": 1.0, "ops_per_sec": ops_per_sec, "p50_us": 800, "p99_us": 4000,
            "server_cpu_us_per_op": 20.0, "server_rss_before_bytes": 1048576,
            "server_rss_after_bytes": 2097152,
            "timeline": [LoadSecond { at_secs: 1.0, ops_per_sec, p50_us: 800, p99_us: 4000,
                errors: 0, server_cpu_us_per_op: Some(20.0),
                server_rss_bytes: Some(1 << 21) }],
        }))
        .unwrap()
    }

    #[test]
    fn earlier_runs_are_read_from_their_whole_output() {
        let dir = tempfile::tempdir().unwrap();
        let unnamed = dir.path().join("before.txt");
        let line = serde_json::to_string(&result("", 256, 1000.0)).unwrap();
        std::fs::write(
            &unnamed,
            format!("  256  create ...\n{line}\n{{\"case\":\"consensus\"}}\n"),
        )
        .unwrap();
        let named = dir.path().join("after.jsonl");
        let line = serde_json::to_string(&result("mimalloc", 256, 2000.0)).unwrap();
        std::fs::write(&named, format!("{line}\n")).unwrap();
        let runs = read_runs(&[unnamed, named]).unwrap();
        assert_eq!(runs[0].label, "before");
        assert_eq!(runs[1].label, "mimalloc");
        assert_eq!(runs[1].results[0].ops_per_sec, 2000.0);

        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let error = read_runs(&[empty]).map(|_| ()).unwrap_err();
        assert!(error.contains("no concord-bench http result"), "{error}");
        let broken = dir.path().join("broken.txt");
        std::fs::write(&broken, "{\"case\":\"http_create\"}\n").unwrap();
        let error = read_runs(&[broken]).map(|_| ()).unwrap_err();
        assert!(error.contains("broken.txt:1"), "{error}");
    }

    #[test]
    fn a_page_holds_every_case_of_every_run() {
        let runs = vec![
            ReportRun {
                label: String::new(),
                results: vec![result("", 1, 900.0), result("", 256, 40_000.0)],
            },
            ReportRun {
                label: "<b>".into(),
                results: vec![result("<b>", 256, 50_000.0)],
            },
        ];
        let page = render("load & more", &runs);
        assert!(page.contains("<title>load &amp; more</title>"), "{page}");
        assert!(
            page.contains("this run (2 cases), &lt;b&gt; (1 cases)"),
            "{page}"
        );
        // Three time charts per case (throughput, latency, memory), three bar charts
        // (throughput, p99, CPU).
        assert_eq!(page.matches("<svg class=\"chart\"").count(), 2 * 3 + 3);
        assert_eq!(page.matches("<tr><td>").count(), 3);
        let alone = render("one", &runs[..1]);
        assert!(!alone.contains("Side by side"));
    }
}
