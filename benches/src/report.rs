//! Benchmark results: a readable table line and a JSON line per case.

use serde::Serialize;

/// Prints `row` as one JSON line on stdout (lines starting with `{` are the machine-readable
/// output: `concord-bench ... | grep '^{'`).
pub fn print_json<T: Serialize>(row: &T) {
    match serde_json::to_string(row) {
        Ok(line) => println!("{line}"),
        Err(error) => eprintln!("cannot encode a result row: {error}"),
    }
}

/// Formats a rate with a unit suffix (k, M) for the readable table.
pub fn human_rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2}M", per_sec / 1e6)
    } else if per_sec >= 1e3 {
        format!("{:.1}k", per_sec / 1e3)
    } else {
        format!("{per_sec:.0}")
    }
}
