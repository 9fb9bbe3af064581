//! `concord backup --output FILE` (from a running node's `GET /v1/backup`) and `concord restore
//! --input FILE --data-dir DIR` (a new data directory from a backup, made offline).

use std::fs;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use clap::{Arg, ArgMatches, Command};
use concord_engine::{BackendKind, BackupSummary};

use crate::admin_client::{Endpoint, endpoint_args};

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
    if output.exists() {
        return Err(format!(
            "{} exists: a backup is written to a new file",
            output.display()
        ));
    }
    let partial = partial_path(output);
    // Held until the rename: the lock goes with this process, however it ends.
    let partial_file = open_partial(&partial)?;
    let downloaded = download_into(&endpoint, consistency, &partial_file, &partial);
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

fn download_into(
    endpoint: &Endpoint,
    consistency: &str,
    file: &fs::File,
    partial: &Path,
) -> Result<u64, String> {
    let mut out = BufWriter::new(file);
    let path = format!("/v1/backup?consistency={consistency}");
    let bytes = endpoint.download(&path, &mut out)?;
    let file = out
        .into_inner()
        .map_err(|error| named(partial, error.into_error()))?;
    file.sync_all().map_err(|error| named(partial, error))?;
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

    #[test]
    fn the_partial_file_sits_beside_the_output() {
        assert_eq!(
            partial_path(Path::new("/backups/today.backup")),
            Path::new("/backups/today.backup.partial")
        );
        assert_eq!(partial_path(Path::new("b")), Path::new("b.partial"));
    }
}
