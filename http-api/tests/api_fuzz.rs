//! The API fuzzed from its own OpenAPI document: schemathesis generates requests for every
//! operation (examples, boundary values, random data, and stateful sequences following the
//! document's links) against the real binary, and checks every answer against the document:
//! no 500, no status, content type, header or body the document does not describe.
//!
//! The checks of what is accepted (`positive_data_acceptance`, `negative_data_rejection`) are
//! left out: they take every schema-valid request for one the server must accept, and the
//! server refuses some for reasons no schema states (a version that does not match, a page
//! token it did not issue, a node that is not a voter).
//!
//! Needs `schemathesis` (`pip install schemathesis`, as .ci/run does); skipped without it,
//! except under `CI=true`. `CONCORD_FUZZ_SECONDS` (default 30) is the time budget.

mod common;

use std::process::Command;

use common::Server;

const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance,\
                      use_after_free,ensure_resource_availability";

/// How to run schemathesis here: its own command, or its module through python3 (a pip
/// install does not always leave the command on the PATH); `None` if neither answers.
fn schemathesis() -> Option<Command> {
    let candidates: [(&str, &[&str]); 2] = [
        ("schemathesis", &[]),
        ("python3", &["-m", "schemathesis.cli"]),
    ];
    candidates.into_iter().find_map(|(program, args)| {
        let answers = Command::new(program)
            .args(args)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success());
        answers.then(|| {
            let mut command = Command::new(program);
            command.args(args);
            command
        })
    })
}

#[test]
fn every_answer_to_generated_requests_matches_the_openapi_document() {
    let Some(mut schemathesis) = schemathesis() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but schemathesis is not installed (.ci/run installs it with pip)"
        );
        println!("SKIPPED: schemathesis is not installed (pip install schemathesis)");
        return;
    };
    let seconds = std::env::var("CONCORD_FUZZ_SECONDS").unwrap_or_else(|_| "30".into());
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--backend", "mem", "--groups", "4"]);
    let output = schemathesis
        .arg("run")
        .arg(format!("http://{}/openapi.json", server.address))
        .args(["--checks", CHECKS])
        .args(["--max-time", &seconds])
        // One worker: with two, hypothesis parses lambdas' source on two threads at once,
        // which Python 3.11's parser does not survive (now and then an "AST constructor
        // recursion depth mismatch" that fails the run for no fault of the server).
        .args(["--workers", "1"])
        .args(["--suppress-health-check", "all"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{report}"
    );
    let summary: Vec<&str> = report
        .lines()
        .filter(|line| line.contains("generated") || line.contains("Seed"))
        .collect();
    println!("schemathesis: {}", summary.join("; "));
    server.stop();
}
