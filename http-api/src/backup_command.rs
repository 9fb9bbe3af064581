//! `concord backup --output FILE` (from a running node's `GET /v1/backup`) and `concord restore
//! --input FILE --data-dir DIR` (a new data directory from a backup, made offline).

use std::fs;
use std::io::{BufReader, BufWriter, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Arg, ArgMatches, Command};
use concord_engine::{BackendKind, BackupSummary};

use crate::admin_client::{AskingAgain, DownloadError, Endpoint, endpoint_args};

/// The `backup` subcommand.
pub fn backup_command() -> Command {
    Command::new("backup")
        .about(
            "Write a backup of a running node's state (every group's, and the group layout) to \
             a file; `concord restore` makes a data directory of it",
        )
        .args(endpoint_args())
        .arg(
            Arg::new("output")
                .long("output")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("The file to write (it must not exist)"),
        )
        .arg(
            Arg::new("consistency")
                .long("consistency")
                .default_value("linearizable")
                .value_parser(["linearizable", "stale"])
                .help(
                    "linearizable: every write acknowledged before the backup is in it; stale: \
                     what the node has applied (a member cut off from its quorum can still give \
                     that)",
                ),
        )
        .arg(
            Arg::new("wait_secs")
                .long("wait-secs")
                .default_value("30")
                .value_parser(clap::value_parser!(u64).range(..=3600))
                .help(
                    "How long to keep asking again while the node answers 503 (a group between \
                     leaders, or the node overloaded), cannot be reached, or breaks off its \
                     answer (it went down or restarted); 0: ask once",
                ),
        )
}

/// The `restore` subcommand.
pub fn restore_command() -> Command {
    Command::new("restore")
        .about(
            "Make a new data directory from a backup: a node served from it starts alone from \
             the backup's state, and members are added to it as to any node",
        )
        .arg(
            Arg::new("input")
                .long("input")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("The backup file"),
        )
        .arg(
            Arg::new("data_dir")
                .long("data-dir")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("The data directory to make (it must not exist, or be empty)"),
        )
        .arg(
            Arg::new("backend")
                .long("backend")
                .default_value("wal")
                .value_parser(["wal", "redb", "sled"])
                .help("The storage backend of the new data directory"),
        )
}

/// Runs `concord backup`: downloads into a file beside the output, checks what arrived is a
/// whole backup, syncs it, and only then gives it the output's name.
pub fn run_backup(matches: &ArgMatches) -> Result<String, String> {
    let endpoint = Endpoint::from_matches(matches)?;
    let output = matches.get_one::<PathBuf>("output").expect("required");
    let consistency = matches
        .get_one::<String>("consistency")
        .expect("has a default");
    let wait = Duration::from_secs(*matches.get_one::<u64>("wait_secs").expect("has a default"));
    if output.exists() {
        return Err(format!(
            "{} exists: a backup is written to a new file",
            output.display()
        ));
    }
    let partial = partial_path(output);
    // Held until the rename: the lock goes with this process, however it ends.
    let partial_file = open_partial(&partial)?;
    let downloaded =
        download_while_unavailable(&endpoint, consistency, &partial_file, &partial, wait)
            .map_err(|error| error.to_string());
    let checked = downloaded.and_then(|_| {
        let file = fs::File::open(&partial).map_err(|error| named(&partial, error))?;
        concord_engine::verify_backup(&mut BufReader::new(file)).map_err(|error| {
            format!(
                "what {} sent is not a whole backup: {error}",
                endpoint.url()
            )
        })
    });
    let summary = match checked {
        Ok(summary) => summary,
        Err(error) => {
            let _ = fs::remove_file(&partial);
            return Err(error);
        }
    };
    // Another run to the same file may have finished while this one downloaded.
    if output.exists() {
        let _ = fs::remove_file(&partial);
        return Err(format!(
            "{} was written by another `concord backup` meanwhile; it is kept",
            output.display()
        ));
    }
    fs::rename(&partial, output).map_err(|error| named(output, error))?;
    sync_parent(output)?;
    Ok(format!(
        "wrote {} ({}) from {}\n",
        output.display(),
        describe(&summary),
        endpoint.url()
    ))
}

/// Runs `concord restore`.
pub fn run_restore(matches: &ArgMatches) -> Result<String, String> {
    let input = matches.get_one::<PathBuf>("input").expect("required");
    let data_dir = matches.get_one::<PathBuf>("data_dir").expect("required");
    let backend: BackendKind = matches
        .get_one::<String>("backend")
        .expect("has a default")
        .parse()?;
    let file = fs::File::open(input).map_err(|error| named(input, error))?;
    let summary = concord_engine::restore_backup(&mut BufReader::new(file), data_dir, backend)
        .map_err(|error| format!("{}: {error}", input.display()))?;
    let mut serve = format!(
        "concord serve --data-dir {} --groups {}",
        data_dir.display(),
        summary.main_groups
    );
    for (name, _) in &summary.plugins {
        serve.push_str(&format!(" --plugin {name}=<its module>"));
    }
    if let Some((_, groups)) = summary.plugins.first() {
        serve.push_str(&format!(" --plugin-groups {groups}"));
    }
    Ok(format!(
        "restored {} into {} ({backend})\nserve it alone, with the plugins the backup's data \
         was written by: {serve}\n",
        describe(&summary),
        data_dir.display(),
    ))
}

/// Opens `FILE.partial` for this run alone, empty. A file left by a run that stopped before it
/// finished (killed, or its machine down) is taken over: its lock went with its process. One
/// locked by a run still going is refused.
fn open_partial(partial: &Path) -> Result<fs::File, String> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(partial)
        .map_err(|error| named(partial, error))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            return Err(format!(
                "{}: another `concord backup` to this file is running",
                partial.display()
            ));
        }
        Err(fs::TryLockError::Error(error)) => return Err(named(partial, error)),
    }
    file.set_len(0).map_err(|error| named(partial, error))?;
    Ok(file)
}

/// Downloads the backup into `file` (`partial`, named in errors), asking again, from the start,
/// while the node answers 503 — with thousands of groups, one of them is between leaders
/// whenever a member restarts — or cannot be reached or breaks off its answer (it went down or
/// restarted), until `wait` has passed. The pauses grow from 200 ms to 2 s; each is said on
/// stderr.
fn download_while_unavailable(
    endpoint: &Endpoint,
    consistency: &str,
    file: &fs::File,
    partial: &Path,
    wait: Duration,
) -> Result<u64, DownloadError> {
    let mut again = AskingAgain::within(wait);
    loop {
        match download_into(endpoint, consistency, file, partial) {
            Err(
                DownloadError::Refused {
                    status: 503,
                    ref message,
                }
                | DownloadError::Interrupted(ref message),
            ) if again.pause(message) => {}
            downloaded => return downloaded,
        }
    }
}

/// One download into `file`, from its start; the file is synced once the body is whole.
fn download_into(
    endpoint: &Endpoint,
    consistency: &str,
    mut file: &fs::File,
    partial: &Path,
) -> Result<u64, DownloadError> {
    let broken = |error: std::io::Error| DownloadError::Broken(named(partial, error));
    file.set_len(0).map_err(broken)?;
    file.seek(SeekFrom::Start(0)).map_err(broken)?;
    let mut out = BufWriter::new(file);
    let path = format!("/v1/backup?consistency={consistency}");
    let bytes = endpoint.download(&path, &mut out)?;
    let file = out
        .into_inner()
        .map_err(|error| broken(error.into_error()))?;
    file.sync_all().map_err(broken)?;
    Ok(bytes)
}

/// `FILE.partial`, beside `FILE`.
fn partial_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    output.with_file_name(name)
}

/// Syncs the directory holding `path`, so that its new name survives a power loss.
fn sync_parent(path: &Path) -> Result<(), String> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    fs::File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| named(parent, error))
}

fn describe(summary: &BackupSummary) -> String {
    format!(
        "{} groups, {} records, {} bytes",
        summary.groups, summary.records, summary.bytes
    )
}

fn named(path: &Path, error: std::io::Error) -> String {
    format!("{}: {error}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_client::answering_in_turn;

    /// The endpoint of a loopback server answering its connections with `answers`.
    fn answering(answers: Vec<&'static [u8]>) -> Endpoint {
        let url = answering_in_turn(answers);
        let matches = Command::new("backup")
            .args(endpoint_args())
            .get_matches_from(["backup", "--endpoint", &url]);
        Endpoint::from_matches(&matches).unwrap()
    }

    const UNAVAILABLE: &[u8] =
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 28\r\n\r\n{\"detail\":\"between leaders\"}";
    const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc";
    const CUT_SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nab";
    const NOT_HTTP: &[u8] = b"SSH-2.0-OpenSSH\r\n";

    #[test]
    fn a_backup_asks_again_while_the_node_is_unavailable_and_no_longer_than_told() {
        let dir = tempfile::tempdir().unwrap();
        let partial = dir.path().join("b.partial");
        let file = open_partial(&partial).unwrap();

        let endpoint = answering(vec![UNAVAILABLE, CUT_SHORT, UNAVAILABLE, WHOLE]);
        let wait = Duration::from_secs(10);
        let downloaded = download_while_unavailable(&endpoint, "stale", &file, &partial, wait);
        assert_eq!(downloaded, Ok(3));
        assert_eq!(fs::read(&partial).unwrap(), b"abc");

        // Once the server is gone, nothing answers at its address: asked again until the wait
        // is over.
        let gone = download_while_unavailable(
            &endpoint,
            "stale",
            &file,
            &partial,
            Duration::from_millis(500),
        );
        assert!(
            matches!(gone, Err(DownloadError::Interrupted(_))),
            "{gone:?}"
        );

        // What is not HTTP is the error at once: asking again would have met the closed
        // address and ended interrupted.
        let endpoint = answering(vec![NOT_HTTP]);
        let garbage = download_while_unavailable(&endpoint, "stale", &file, &partial, wait);
        assert!(
            matches!(garbage, Err(DownloadError::Broken(_))),
            "{garbage:?}"
        );

        let endpoint = answering(vec![UNAVAILABLE, WHOLE]);
        let once = download_while_unavailable(&endpoint, "stale", &file, &partial, Duration::ZERO);
        let message = "GET /v1/backup?consistency=stale: HTTP 503: between leaders".to_string();
        assert_eq!(
            once,
            Err(DownloadError::Refused {
                status: 503,
                message
            })
        );
    }

    #[test]
    fn a_partial_file_held_by_a_running_backup_is_refused_and_a_stale_one_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let partial = dir.path().join("b.partial");
        fs::write(&partial, b"left by a killed run").unwrap();
        let first = open_partial(&partial).unwrap();
        assert_eq!(fs::metadata(&partial).unwrap().len(), 0);
        let error = open_partial(&partial).unwrap_err();
        assert!(error.contains("another `concord backup`"), "{error}");
        drop(first);
        open_partial(&partial).unwrap();
    }

    #[test]
    fn the_partial_file_sits_beside_the_output() {
        assert_eq!(
            partial_path(Path::new("/backups/today.backup")),
            Path::new("/backups/today.backup.partial")
        );
        assert_eq!(partial_path(Path::new("b")), Path::new("b.partial"));
    }
}
