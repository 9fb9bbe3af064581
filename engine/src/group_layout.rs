//! The group count a data directory was created with, kept beside the stores: keys route by
//! `hash % groups`, so opening the same data with another count would look for keys in the
//! wrong groups.

use std::fs;
use std::io::Write;
use std::path::Path;

use concord_storage::GroupId;

use crate::EngineError;

/// The file name, in the data directory.
pub const GROUP_LAYOUT_FILE: &str = "ENGINE_GROUPS";

/// Records `groups` for a new data directory, or checks it against the recorded count.
///
/// `held_groups` are the groups the stores hold data of. The record's absence means a new
/// directory only when they hold none: data without its record is refused (keys would route
/// by whatever count was asked), and so is data of a group the record does not count.
pub(crate) fn check_or_record(
    data_dir: &Path,
    groups: u32,
    held_groups: &[GroupId],
) -> Result<(), EngineError> {
    let path = data_dir.join(GROUP_LAYOUT_FILE);
    let highest_held = held_groups.iter().copied().max();
    match fs::read_to_string(&path) {
        Ok(text) => {
            let recorded = parse(&text).ok_or_else(|| EngineError::Layout {
                path: path.display().to_string(),
                problem: format!("expected `groups = <n>`, found {:?}", truncate(&text)),
            })?;
            if recorded != groups {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "the data was created with {recorded} groups, the configuration asks \
                         for {groups}; keys route by group count, so it cannot change"
                    ),
                });
            }
            if let Some(highest) = highest_held
                && highest >= u64::from(recorded)
            {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "records {recorded} groups, but the stores hold data of group \
                         {highest}; the record does not describe this data"
                    ),
                });
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(highest) = highest_held {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "is missing, but the stores hold data (groups up to {highest}); \
                         keys route by the group count the data was created with: restore \
                         the file (`groups = <n>`) rather than guess it"
                    ),
                });
            }
            write(&path, groups).map_err(|error| EngineError::Layout {
                path: path.display().to_string(),
                problem: format!("cannot record the group count: {error}"),
            })
        }
        Err(error) => Err(EngineError::Layout {
            path: path.display().to_string(),
            problem: format!("cannot read: {error}"),
        }),
    }
}

fn parse(text: &str) -> Option<u32> {
    let value = text.trim().strip_prefix("groups")?.trim_start();
    value.strip_prefix('=')?.trim().parse().ok()
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Writes through a temporary file and a rename, so a crash leaves the old file or the new.
fn write(path: &Path, groups: u32) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = fs::File::create(&temporary)?;
    writeln!(file, "groups = {groups}")?;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_then_checks() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), 8, &[]).unwrap();
        check_or_record(dir.path(), 8, &[0, 7]).unwrap();
        let error = check_or_record(dir.path(), 4, &[0, 7])
            .unwrap_err()
            .to_string();
        assert!(error.contains("created with 8 groups"), "{error}");
        let error = check_or_record(dir.path(), 8, &[8])
            .unwrap_err()
            .to_string();
        assert!(error.contains("hold data of group 8"), "{error}");
        fs::write(dir.path().join(GROUP_LAYOUT_FILE), "garbage").unwrap();
        let error = check_or_record(dir.path(), 8, &[]).unwrap_err().to_string();
        assert!(error.contains("expected `groups = <n>`"), "{error}");
    }

    #[test]
    fn a_missing_record_over_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = check_or_record(dir.path(), 4, &[0, 1, 5])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("is missing, but the stores hold data"),
            "{error}"
        );
        assert!(!dir.path().join(GROUP_LAYOUT_FILE).exists());
    }
}
