//! The group layout a data directory was created with, kept beside the stores: the main group
//! count and, after it, each served plugin's name and group count, in order. Keys route by
//! `hash % groups` within their state machine's range of groups, so opening the same data with
//! another layout would look for keys in the wrong groups. A plugin may be added at the end
//! (its groups are new); nothing else may change.

use std::fs;
use std::path::Path;

use concord_storage::GroupId;

use crate::EngineError;

/// The file name, in the data directory.
pub const GROUP_LAYOUT_FILE: &str = "ENGINE_GROUPS";

/// A data directory's layout: the main groups, then each plugin's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupLayout {
    pub(crate) groups: u32,
    /// `(name, groups)` in order.
    pub(crate) plugins: Vec<(String, u32)>,
}

impl GroupLayout {
    /// The layout `config` asks for: its main groups, then each served plugin's.
    pub(crate) fn of(config: &crate::EngineConfig) -> GroupLayout {
        GroupLayout {
            groups: config.groups,
            plugins: (config.plugins.iter())
                .map(|plugin| (plugin.name.clone(), plugin.groups))
                .collect(),
        }
    }

    pub(crate) fn total_groups(&self) -> u64 {
        u64::from(self.groups) + self.plugins.iter().map(|(_, n)| u64::from(*n)).sum::<u64>()
    }

    /// The record's text: `groups = <n>`, then a `plugin <name> = <n>` line per plugin.
    pub(crate) fn text(&self) -> String {
        let mut text = format!("groups = {}\n", self.groups);
        for (name, groups) in &self.plugins {
            text.push_str(&format!("plugin {name} = {groups}\n"));
        }
        text
    }
}

/// Records `layout` for a new data directory, or checks it against the recorded one (and
/// records plugins added at its end).
///
/// `held_groups` are the groups the stores hold data of. The record's absence means a new
/// directory only when they hold none: data without its record is refused (keys would route
/// by whatever count was asked), and so is data of a group the record does not count.
pub(crate) fn check_or_record(
    data_dir: &Path,
    layout: &GroupLayout,
    held_groups: &[GroupId],
) -> Result<(), EngineError> {
    let path = data_dir.join(GROUP_LAYOUT_FILE);
    let highest_held = held_groups.iter().copied().max();
    let groups = layout.groups;
    match fs::read_to_string(&path) {
        Ok(text) => {
            let recorded_layout = parse(&text).ok_or_else(|| EngineError::Layout {
                path: path.display().to_string(),
                problem: format!(
                    "expected `groups = <n>` and `plugin <name> = <n>` lines, found {:?}",
                    truncate(&text)
                ),
            })?;
            let recorded = recorded_layout.groups;
            if recorded != groups {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "the data was created with {recorded} groups, the configuration asks \
                         for {groups}; keys route by group count, so it cannot change"
                    ),
                });
            }
            let kept = layout.plugins.get(..recorded_layout.plugins.len());
            if kept != Some(&recorded_layout.plugins[..]) {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "the data serves the plugins {}, the configuration {}; a plugin may \
                         only be added after the others (its keys route within its own groups)",
                        describe(&recorded_layout.plugins),
                        describe(&layout.plugins)
                    ),
                });
            }
            if let Some(highest) = highest_held
                && highest >= recorded_layout.total_groups()
            {
                return Err(EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!(
                        "records {} groups, but the stores hold data of group {highest}; the \
                         record does not describe this data",
                        recorded_layout.total_groups()
                    ),
                });
            }
            if layout.plugins.len() > recorded_layout.plugins.len() {
                write(&path, layout).map_err(|error| EngineError::Layout {
                    path: path.display().to_string(),
                    problem: format!("cannot record the added plugins: {error}"),
                })?;
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
            write(&path, layout).map_err(|error| EngineError::Layout {
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

pub(crate) fn parse(text: &str) -> Option<GroupLayout> {
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let groups = parse_count(lines.next()?.strip_prefix("groups")?)?;
    let mut plugins = Vec::new();
    for line in lines {
        let (name, count) = line.strip_prefix("plugin ")?.split_once('=')?;
        plugins.push((name.trim().to_string(), count.trim().parse().ok()?));
    }
    Some(GroupLayout { groups, plugins })
}

/// The number after `=` in `= <n>` (the key already taken off).
fn parse_count(rest: &str) -> Option<u32> {
    rest.trim_start().strip_prefix('=')?.trim().parse().ok()
}

fn describe(plugins: &[(String, u32)]) -> String {
    if plugins.is_empty() {
        return "(none)".into();
    }
    plugins
        .iter()
        .map(|(name, groups)| format!("{name} ({groups} groups)"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Records `layout` at `path` (replaced whole: a crash leaves the old record or the new).
pub(crate) fn write(path: &Path, layout: &GroupLayout) -> std::io::Result<()> {
    crate::durable_file::replace(path, &layout.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(groups: u32, plugins: &[(&str, u32)]) -> GroupLayout {
        GroupLayout {
            groups,
            plugins: plugins.iter().map(|(n, g)| (n.to_string(), *g)).collect(),
        }
    }

    #[test]
    fn plugins_may_be_added_at_the_end_only() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), &layout(8, &[("kv", 2)]), &[]).unwrap();
        check_or_record(dir.path(), &layout(8, &[("kv", 2)]), &[0, 9]).unwrap();
        // Added at the end: recorded.
        check_or_record(dir.path(), &layout(8, &[("kv", 2), ("counter", 1)]), &[9]).unwrap();
        let text = fs::read_to_string(dir.path().join(GROUP_LAYOUT_FILE)).unwrap();
        assert_eq!(text, "groups = 8\nplugin kv = 2\nplugin counter = 1\n");
        for wrong in [
            layout(8, &[("kv", 2)]),
            layout(8, &[("counter", 1), ("kv", 2)]),
            layout(8, &[("kv", 3), ("counter", 1)]),
            layout(8, &[]),
        ] {
            let error = check_or_record(dir.path(), &wrong, &[])
                .unwrap_err()
                .to_string();
            assert!(error.contains("a plugin may only be added"), "{error}");
        }
        let error = check_or_record(dir.path(), &layout(8, &[("kv", 2), ("counter", 1)]), &[11])
            .unwrap_err()
            .to_string();
        assert!(error.contains("records 11 groups"), "{error}");
    }

    #[test]
    fn records_then_checks() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), &layout(8, &[]), &[]).unwrap();
        check_or_record(dir.path(), &layout(8, &[]), &[0, 7]).unwrap();
        let error = check_or_record(dir.path(), &layout(4, &[]), &[0, 7])
            .unwrap_err()
            .to_string();
        assert!(error.contains("created with 8 groups"), "{error}");
        let error = check_or_record(dir.path(), &layout(8, &[]), &[8])
            .unwrap_err()
            .to_string();
        assert!(error.contains("hold data of group 8"), "{error}");
        fs::write(dir.path().join(GROUP_LAYOUT_FILE), "garbage").unwrap();
        let error = check_or_record(dir.path(), &layout(8, &[]), &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected `groups = <n>`"), "{error}");
    }

    #[test]
    fn a_missing_record_over_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = check_or_record(dir.path(), &layout(4, &[]), &[0, 1, 5])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("is missing, but the stores hold data"),
            "{error}"
        );
        assert!(!dir.path().join(GROUP_LAYOUT_FILE).exists());
    }
}
