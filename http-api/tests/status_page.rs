//! The status page in headless Chromium: it must render live data from the running binary.
//! Skipped (with a message) where Chromium is not installed; `.ci/run` installs Debian's
//! `chromium`. (`docs/status-page.png` is the same page against a release build under load:
//! see the README.)

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Server, request};

/// The page's one-second polling loop runs several times in this much virtual time.
const VIRTUAL_TIME_MS: u32 = 6000;

fn headless(chromium: &Path, args: &[&str], url: &str) -> std::process::Output {
    common::headless_chromium(chromium, VIRTUAL_TIME_MS, args, url)
}

#[test]
fn status_page_renders_live_node_data_in_chromium() {
    let Some(chromium) = common::chromium_or_skip("the status page") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kv = format!(
        "kv={}/../fixtures/plugins/kv.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    let server = Server::start(
        dir.path(),
        &["--groups", "4", "--plugin", &kv, "--plugin-groups", "1"],
    );
    // Keep writing while the page polls, so that the charts have something to draw.
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                n += 1;
                let body = format!(r#"{{"client_id": "page/{n}", "broker_id": "b"}}"#);
                let (status, answer) =
                    request(&server.address, "POST", "/v1/sessions", Some(&body));
                assert_eq!(status, 201, "{answer}");
            }
        });
        let checked = std::panic::catch_unwind(|| check_page(&chromium, &server.address));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
    });
    server.stop();
}

fn check_page(chromium: &Path, address: &str) {
    let docs = headless(chromium, &["--dump-dom"], &format!("http://{address}/docs"));
    let docs = String::from_utf8_lossy(&docs.stdout);
    assert!(docs.contains(r#"data-rendered="true""#), "{docs}");
    assert!(docs.contains("/v1/sessions/{client_id}"), "{docs}");

    let url = format!("http://{address}/");
    let dom = headless(chromium, &["--dump-dom"], &url);
    let html = String::from_utf8_lossy(&dom.stdout);
    let samples: u32 = html
        .split("data-samples=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the page never rendered /v1/status:\n{html}\n{}",
                String::from_utf8_lossy(&dom.stderr)
            )
        });
    assert!(samples >= 2, "{samples} samples");
    assert!(
        html.contains(r#"<b id="state" class="ok">ready</b>"#),
        "{html}"
    );
    // Four session groups and the kv plugin's one, all listed (the page asks for 32), all led
    // here.
    assert!(html.contains(r#"<b id="groups">5</b>"#), "{html}");
    assert!(
        html.contains(
            "all 5 listed · led here 5 · without leader 0 · stopped 0 · catching up 0 · asleep "
        ),
        "{html}"
    );
    assert_eq!(
        html.matches(" (this node)</td>").count(),
        6,
        "one row per group, and this node's among the members"
    );
    // Alone: a voter without raft address or URL, reachable, speaking this build's peer
    // protocol, keeping its vote for 9 ticks of 100 ms, leading all five groups.
    let own_row = html
        .split("1 (this node)</td><td>voter</td><td>–</td><td>–</td><td>yes</td><td>")
        .nth(1)
        .unwrap_or_else(|| panic!("no row for this node:\n{html}"));
    let cells: Vec<&str> = own_row.splitn(4, "</td><td>").collect();
    let [protocol, quiet, led, ..] = cells[..] else {
        panic!("a short row for this node:\n{html}");
    };
    let led = led.split("</td>").next().unwrap_or_default();
    assert!(protocol.parse::<u16>().is_ok_and(|v| v > 0), "{html}");
    assert_eq!(quiet, "900", "{html}");
    assert_eq!(led, "5", "{html}");
    assert!(
        html.contains(r#"<span id="snapshots-sending">0</span>"#),
        "{html}"
    );
    // The bundled session plugin, named with the start of its hash, its commands counted; the
    // served kv plugin on a row of its own.
    assert!(html.contains(r#"<b id="plugin">session · "#), "{html}");
    assert!(html.contains(" + 1 served</b>"), "{html}");
    let session_row = html
        .split(r#"<tbody id="plugin-rows"><tr><td>session</td><td>"#)
        .nth(1)
        .unwrap_or_else(|| panic!("no session plugin row:\n{html}"));
    let plugin_commands: u64 = session_row
        .split("</td><td>")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no command count:\n{html}"));
    assert!(plugin_commands > 0, "{html}");
    assert!(html.contains("<tr><td>kv</td>"), "{html}");

    let screenshot_dir = tempfile::tempdir().unwrap();
    let path = screenshot_dir.path().join("status-page.png");
    let shot = headless(
        chromium,
        &[
            &format!("--screenshot={}", path.display()),
            "--window-size=1280,860",
        ],
        &url,
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let png = std::fs::read(&path).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
}
