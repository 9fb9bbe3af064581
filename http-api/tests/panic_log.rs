//! A panic the server goes on after is written as an error line of its log, in the log's own
//! format, not in Rust's form beside it. (A file of its own: the panic hook is the process's.)

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// What the log's subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Panics with `panic` on a thread named `thread` (or without a name), and returns the log
/// line that says so.
fn log_line_of_a_panic(captured: &Captured, thread: Option<&str>, panic: fn()) -> String {
    let before = captured.text().len();
    let mut builder = std::thread::Builder::new();
    if let Some(name) = thread {
        builder = builder.name(name.to_string());
    }
    let joined = builder.spawn(panic).unwrap().join();
    assert!(joined.is_err(), "the thread did not panic");
    let text = captured.text();
    let written = &text[before..];
    written
        .lines()
        .find(|line| line.contains("panicked"))
        .unwrap_or_else(|| panic!("no log line says the panic: {written:?}"))
        .to_string()
}

#[test]
fn a_panic_is_an_error_line_naming_the_thread_the_place_and_the_message() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    concord_http::log_panics();

    let line = log_line_of_a_panic(&captured, Some("concord-raft-0-0"), || {
        panic!("entry {} conflicts with a committed one", 42)
    });
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("panicked: entry 42 conflicts with a committed one"),
        "{line}"
    );
    assert!(line.contains("concord-raft-0-0"), "{line}");
    assert!(line.contains("tests/panic_log.rs:"), "{line}");

    // A message without arguments, on a thread without a name.
    let line = log_line_of_a_panic(&captured, None, || panic!("a damaged page"));
    assert!(line.contains("panicked: a damaged page"), "{line}");
    assert!(line.contains("ERROR") && line.contains("unnamed"), "{line}");
}
