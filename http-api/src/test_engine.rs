//! The engine the crate's unit tests run against: one group, in memory.

use std::path::Path;

use concord_engine::{BackendKind, Engine, EngineConfig};

/// A single node of one group with nothing on disk (`dir` is only named, not written).
pub(crate) fn one_group_in_memory(dir: &Path) -> Engine {
    let mut config = EngineConfig::new(dir);
    config.backend = Some(BackendKind::Memory);
    config.groups = 1;
    Engine::open(config).expect("an engine in memory opens")
}
