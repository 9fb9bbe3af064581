//! The load tool against the real binary: a closed-loop and an open-loop case measure a live
//! server (found by its port), and the report comparing them renders in headless Chromium.
//! The Chromium part is skipped (with a message) where Chromium is not installed; `.ci/run`
//! installs it.

mod common;

use std::time::Duration;

use common::Server;
use concord_bench::http_load::{self, HttpBenchConfig};
use concord_bench::http_result::HttpResult;
use concord_bench::http_workload::{ClientIds, Workload};

fn config(address: &str, label: &str) -> HttpBenchConfig {
    HttpBenchConfig {
        address: address.to_string(),
        connections: vec![2],
        workload: Workload::Create,
        client_ids: ClientIds::Counter,
        duration: Duration::from_millis(1500),
        rate_per_sec: None,
        client_threads: 1,
        server_pid: None,
        run_id: label.to_string(),
        label: label.to_string(),
        report: None,
        compare: Vec::new(),
        live: true,
    }
}

fn check_measured(result: &HttpResult) {
    assert_eq!(result.errors(), 0, "{:?}", result.first_error);
    assert!(
        result.ops > 0 && result.ops == result.requests,
        "{result:?}"
    );
    assert!(
        0 < result.p50_us && result.p50_us <= result.p99_us && result.p99_us <= result.max_us,
        "{result:?}"
    );
    assert!(!result.timeline.is_empty(), "{result:?}");
    // Found by the port it listens on: the server's CPU and memory are in the result.
    assert!(result.server_cpu_us_per_op.is_some(), "{result:?}");
    assert!(result.server_rss_after_bytes.unwrap_or(0) > 0, "{result:?}");
    // And its threads by kind: the HTTP runtime's and the engine's, with their context
    // switches, and their waits for a core where the kernel keeps them.
    for kind in ["concord-http", "concord-raft", "concord-apply"] {
        assert!(
            result.server_cpu_us_per_op_by_thread.contains_key(kind),
            "{kind} in {result:?}"
        );
        assert!(
            result
                .server_context_switches_per_1k_ops_by_thread
                .contains_key(kind),
            "{kind} in {result:?}"
        );
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(
                result
                    .server_run_queue_wait_ms_per_sec_by_thread
                    .contains_key(kind),
                "{kind} in {result:?}"
            );
        }
    }
}

#[test]
fn the_load_tool_measures_a_live_server_and_its_report_renders() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &["--groups", "2"]);
    let out = tempfile::tempdir().unwrap();

    let closed = http_load::run(&config(&server.address, "closed")).unwrap();
    assert_eq!(closed[0].mode, "closed");
    check_measured(&closed[0]);
    let earlier = out.path().join("closed.jsonl");
    std::fs::write(&earlier, serde_json::to_string(&closed[0]).unwrap()).unwrap();

    // 200 requests/s over two connections for 1.5 s: each connection is due every 10 ms,
    // the second 5 ms after the first, so 300 requests are due, sent or (if the server fell
    // behind) counted as unsent. Its sessions get random ids: each one new to the server.
    let report = out.path().join("report.html");
    let open = http_load::run(&HttpBenchConfig {
        rate_per_sec: Some(200.0),
        client_ids: ClientIds::Random,
        report: Some(report.clone()),
        compare: vec![earlier],
        ..config(&server.address, "open")
    })
    .unwrap();
    assert_eq!(open[0].mode, "open");
    check_measured(&open[0]);
    assert_eq!(
        (closed[0].client_ids.as_str(), open[0].client_ids.as_str()),
        ("counter", "random")
    );
    let due = open[0].requests + open[0].unsent_requests;
    assert!(
        (299..=301).contains(&due),
        "{due} requests due: {:?}",
        open[0]
    );
    server.stop();

    let page = std::fs::read_to_string(&report).unwrap();
    assert!(
        page.contains("<td>closed</td><td>create · 2 conn</td>"),
        "{page}"
    );
    assert!(
        page.contains("<td>open</td><td>create · 2 conn · 200/s open</td>"),
        "{page}"
    );
    let charts = page.matches("<svg class=\"chart\"").count();
    // Throughput, p99 and CPU side by side; throughput, latency and the server's memory over
    // time for each case.
    assert_eq!(charts, 3 + 2 * 3, "{page}");

    let Some(chromium) = common::chromium_or_skip("the report in Chromium") else {
        return;
    };
    let url = format!("file://{}", report.display());
    let headless = |args: &[&str]| common::headless_chromium(&chromium, 2000, args, &url);
    let dom = headless(&["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains(&format!("data-charts-drawn=\"{charts}\"")),
        "not every chart laid out:\n{dom}"
    );
    let screenshot = out.path().join("report.png");
    let shot = headless(&[
        &format!("--screenshot={}", screenshot.display()),
        "--window-size=1280,1400",
    ]);
    let bytes = std::fs::metadata(&screenshot).map_or(0, |meta| meta.len());
    // A blank page of this size compresses to a few KB; charts and tables do not.
    assert!(
        bytes > 40_000,
        "screenshot of {bytes} bytes: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
}
