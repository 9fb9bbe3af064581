//! The group count a data directory was created with, kept beside the stores: keys route by
//! `hash % groups`, so opening the same data with another count would look for keys in the
//! wrong groups.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::EngineError;

/// The file name, in the data directory.
pub const GROUP_LAYOUT_FILE: &str = "ENGINE_GROUPS";

/// Records `groups` for a new data directory, or checks it against the recorded count.
pub(crate) fn check_or_record(data_dir: &Path, groups: u32) -> Result<(), EngineError> {
    let path = data_dir.join(GROUP_LAYOUT_FILE);
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
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
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
        check_or_record(dir.path(), 8).unwrap();
        check_or_record(dir.path(), 8).unwrap();
        let error = check_or_record(dir.path(), 4).unwrap_err().to_string();
        assert!(error.contains("created with 8 groups"), "{error}");
        fs::write(dir.path().join(GROUP_LAYOUT_FILE), "garbage").unwrap();
        let error = check_or_record(dir.path(), 8).unwrap_err().to_string();
        assert!(error.contains("expected `groups = <n>`"), "{error}");
    }
}
