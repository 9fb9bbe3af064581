//! The vote quiet this member said to its peers, kept beside the stores.
//!
//! A leader's lease counts on each voter that answered it keeping its vote for the quiet the
//! voter said in its hello (`NodeConfig::vote_quiet`). A member that restarts forgets whom it
//! answered and holds its vote for its own election timeout; when its ticks were shortened
//! across the restart, that is shorter than the quiet a running lease counts on. So a start
//! reads the quiet recorded by the runs before, holds the vote for it
//! (`NodeConfig::previous_vote_quiet`), and records today's quiet only once the recorded one
//! has passed: a crash meanwhile leaves the longer one for the next start.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::EngineError;

/// The file name, in the data directory of a cluster member on a store that keeps its data:
/// `vote_quiet_ms = <n>`, the longest quiet a leader's lease may still count on from this
/// member's runs before.
pub const VOTE_QUIET_FILE: &str = "VOTE_QUIET";

/// The longest quiet a record may say: far beyond any quiet the settings allow, so that a
/// record that says more is damaged, not a setting.
const MAX_RECORDED_QUIET: Duration = Duration::from_secs(3600);

/// Reads the quiet recorded in `data_dir` by earlier runs, records `own` (this run's quiet)
/// unless the recorded one is longer, and returns the recorded one when it is longer than
/// `own` (else zero): the vote must be held that long after the start.
pub(crate) fn take_over(data_dir: &Path, own: Duration) -> Result<Duration, EngineError> {
    let path = data_dir.join(VOTE_QUIET_FILE);
    let recorded = read(&path)?;
    if recorded > own {
        return Ok(recorded);
    }
    if recorded != own || !path.exists() {
        write(&path, own)?;
    }
    Ok(Duration::ZERO)
}

/// Records `own` in `data_dir` once `previous` has passed from its start: by then no lease
/// counting on the longer quiet this member said before it restarted can run. Dropped before
/// that, it records nothing (the longer quiet stays for the next start).
pub(crate) struct QuietKeeper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl QuietKeeper {
    /// Starts the wait on a thread of its own.
    pub(crate) fn start(
        data_dir: &Path,
        previous: Duration,
        own: Duration,
    ) -> std::io::Result<QuietKeeper> {
        let path = data_dir.join(VOTE_QUIET_FILE);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("concord-vote-quiet".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(previous) {
                    record_after_wait(&path, own);
                }
            })?;
        Ok(QuietKeeper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for QuietKeeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn record_after_wait(path: &Path, own: Duration) {
    match write(path, own) {
        Ok(()) => tracing::info!(
            vote_quiet_ms = own.as_millis() as u64,
            "the longer vote quiet said before the restart has passed; recorded this run's"
        ),
        // The longer quiet stays recorded: the next start holds its vote longer than needed,
        // which costs availability, not safety.
        Err(error) => tracing::warn!(%error, path = %path.display(), "recording the vote quiet"),
    }
}

/// The quiet recorded at `path`; zero if there is no record (a new data directory, or one
/// written before the record existed: its members said their quiet in no hello, so every
/// lease over them was the leader's own length).
fn read(path: &Path) -> Result<Duration, EngineError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Duration::ZERO),
        Err(error) => {
            return Err(EngineError::VoteQuiet {
                path: path.display().to_string(),
                problem: format!("cannot read: {error}"),
            });
        }
    };
    parse(&text)
        .filter(|quiet| *quiet <= MAX_RECORDED_QUIET)
        .ok_or_else(|| EngineError::VoteQuiet {
            path: path.display().to_string(),
            problem: format!(
                "expected `vote_quiet_ms = <n>` (at most {} ms), found {:?}; the file is \
                 damaged: after the longest election timeout this member ever ran with has \
                 passed since it stopped, remove the file and start it again",
                MAX_RECORDED_QUIET.as_millis(),
                text.chars().take(64).collect::<String>()
            ),
        })
}

fn parse(text: &str) -> Option<Duration> {
    let value = text.trim().strip_prefix("vote_quiet_ms")?.trim_start();
    let millis: u64 = value.strip_prefix('=')?.trim().parse().ok()?;
    Some(Duration::from_millis(millis))
}

fn write(path: &Path, quiet: Duration) -> Result<(), EngineError> {
    // Whole milliseconds, rounded up: the record must never say less than was said.
    let millis = quiet.as_nanos().div_ceil(1_000_000);
    crate::durable_file::replace(path, &format!("vote_quiet_ms = {millis}\n")).map_err(|error| {
        EngineError::VoteQuiet {
            path: path.display().to_string(),
            problem: format!("cannot record the vote quiet: {error}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn recorded(dir: &Path) -> String {
        std::fs::read_to_string(dir.join(VOTE_QUIET_FILE)).unwrap()
    }

    #[test]
    fn a_start_holds_the_longer_quiet_said_before_and_records_its_own_once_it_passed() {
        let dir = tempfile::tempdir().unwrap();
        let long = Duration::from_millis(1800);
        let short = Duration::from_millis(180);
        // A new directory: nothing to hold; this run's quiet is recorded.
        assert_eq!(take_over(dir.path(), long).unwrap(), Duration::ZERO);
        assert_eq!(recorded(dir.path()), "vote_quiet_ms = 1800\n");
        // Restarted with shorter ticks: hold the longer one, which stays recorded.
        assert_eq!(take_over(dir.path(), short).unwrap(), long);
        assert_eq!(recorded(dir.path()), "vote_quiet_ms = 1800\n");
        // Stopped before it passed: still recorded (the next start holds it again).
        let keeper = QuietKeeper::start(dir.path(), long, short).unwrap();
        let dropped_at = Instant::now();
        drop(keeper);
        assert!(
            dropped_at.elapsed() < Duration::from_millis(500),
            "a drop waits for nothing"
        );
        assert_eq!(take_over(dir.path(), short).unwrap(), long);
        // Once it passed, this run's is recorded and a later start holds nothing more.
        let keeper = QuietKeeper::start(dir.path(), Duration::from_millis(50), short).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(recorded(dir.path()), "vote_quiet_ms = 180\n");
        drop(keeper);
        assert_eq!(take_over(dir.path(), short).unwrap(), Duration::ZERO);
        // Longer ticks: recorded at once.
        assert_eq!(take_over(dir.path(), long).unwrap(), Duration::ZERO);
        assert_eq!(recorded(dir.path()), "vote_quiet_ms = 1800\n");
    }

    #[test]
    fn a_damaged_record_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(VOTE_QUIET_FILE);
        for damaged in [
            "",
            "vote_quiet_ms = ",
            "vote_quiet_ms = -3",
            "vote_quiet_ms = 99999999999999999999999",
            "vote_quiet_ms = 3600001",
            "groups = 8",
            "\u{0}\u{1}garbage",
        ] {
            std::fs::write(&path, damaged).unwrap();
            let error = take_over(dir.path(), Duration::from_millis(900))
                .unwrap_err()
                .to_string();
            assert!(error.contains("expected `vote_quiet_ms = <n>`"), "{error}");
            assert!(error.contains("remove the file"), "{error}");
        }
        std::fs::write(&path, "  vote_quiet_ms=1200  \n").unwrap();
        assert_eq!(
            take_over(dir.path(), Duration::from_millis(900)).unwrap(),
            Duration::from_millis(1200)
        );
    }

    #[test]
    fn a_quiet_is_recorded_rounded_up_to_the_millisecond() {
        let dir = tempfile::tempdir().unwrap();
        take_over(dir.path(), Duration::from_micros(1_800_001)).unwrap();
        assert_eq!(recorded(dir.path()), "vote_quiet_ms = 1801\n");
    }
}
