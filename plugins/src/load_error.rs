//! Why a plugin could not be loaded.

/// A plugin that cannot run, with the reason named.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The bytes are not a WebAssembly module.
    #[error("not a WebAssembly module: {0}")]
    NotWasm(String),
    /// The module failed validation or compilation.
    #[error("invalid WebAssembly module: {0}")]
    Invalid(String),
    /// An export the ABI requires is missing or has the wrong type.
    #[error("missing or mistyped export `{name}`: {problem}")]
    Export {
        /// The export.
        name: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The module imports something the host does not provide.
    #[error("unknown import `{module}::{name}`")]
    Import {
        /// The import's module.
        module: String,
        /// The import's name.
        name: String,
    },
    /// The plugin speaks another ABI version.
    #[error("plugin ABI version {found}, the host speaks {expected}")]
    AbiVersion {
        /// What the plugin returned.
        found: i64,
        /// [`concord_plugin_abi::ABI_VERSION`].
        expected: u32,
    },
    /// The plugin failed while being instantiated or asked for its version.
    #[error("plugin failed to start: {0}")]
    Start(String),
    /// The engine could not be configured.
    #[error("wasm engine: {0}")]
    Engine(String),
}
