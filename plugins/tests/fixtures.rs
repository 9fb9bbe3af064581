//! The committed plugin fixtures are what their sources build to.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn wasm_target_installed() -> bool {
    let Ok(output) = Command::new("rustc").args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib/wasm32-unknown-unknown")
        .is_dir()
}

#[test]
fn committed_fixtures_match_a_fresh_build() {
    if !wasm_target_installed() {
        // Builds and tests never need the target; only this comparison does. CI installs it,
        // so there a missing target is a failure, not a skip.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but the wasm32-unknown-unknown target is not installed (.ci/run adds it)"
        );
        eprintln!("skipped: the wasm32-unknown-unknown target is not installed");
        return;
    }
    let root = repository_root();
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("bash")
        .arg(root.join("fixtures/build-plugins.sh"))
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success(), "fixtures/build-plugins.sh failed");
    for plugin in ["session", "kv", "counter", "stateful", "kv-v2"] {
        let committed =
            std::fs::read(root.join(format!("fixtures/plugins/{plugin}.wasm"))).unwrap();
        let fresh = std::fs::read(out.path().join(format!("{plugin}.wasm"))).unwrap();
        assert!(
            committed == fresh,
            "fixtures/plugins/{plugin}.wasm differs from a fresh build: run fixtures/build-plugins.sh and commit"
        );
    }
}
