//! Compiled modules on disk, so a restart does not recompile its plugins.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::LoadError;

/// The hex SHA-256 of a plugin's bytes: its identity.
pub(crate) fn plugin_hash(wasm: &[u8]) -> String {
    let digest = Sha256::digest(wasm);
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The module for `wasm`, from `cache_dir` if an entry exists for this plugin hash and this
/// engine's compatibility hash, compiled (and stored) otherwise.
pub(crate) fn load_or_compile(
    engine: &Engine,
    cache_dir: Option<&Path>,
    wasm: &[u8],
    hash: &str,
) -> Result<Module, LoadError> {
    let Some(cache_dir) = cache_dir else {
        return compile(engine, wasm);
    };
    let path = entry_path(engine, cache_dir, hash);
    // Read into memory rather than mapped: a mapped file truncated by someone else would take
    // the process down with SIGBUS.
    if let Ok(bytes) = std::fs::read(&path) {
        // SAFETY: the file is one this function wrote from `Module::serialize` for this
        // engine's compatibility hash, in a directory the node owns. wasmtime still checks its
        // header and compatibility and refuses a file from another version or configuration.
        #[allow(unsafe_code)]
        match unsafe { Module::deserialize(engine, &bytes) } {
            Ok(module) => return Ok(module),
            Err(error) => tracing::warn!(
                path = %path.display(),
                %error,
                "unusable entry in the plugin module cache; recompiling"
            ),
        }
    }
    let module = compile(engine, wasm)?;
    if let Err(error) = store(&module, cache_dir, &path) {
        tracing::warn!(path = %path.display(), %error, "cannot write the plugin module cache");
    }
    Ok(module)
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Module, LoadError> {
    Module::from_binary(engine, wasm).map_err(|error| LoadError::Invalid(format!("{error:#}")))
}

fn entry_path(engine: &Engine, cache_dir: &Path, hash: &str) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    cache_dir.join(format!("{hash}-{:016x}.cwasm", hasher.finish()))
}

/// Writes through a temporary file and a rename, so a crash never leaves half an entry.
fn store(module: &Module, cache_dir: &Path, path: &Path) -> std::io::Result<()> {
    let bytes = module
        .serialize()
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    std::fs::create_dir_all(cache_dir)?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}
