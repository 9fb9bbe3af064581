//! Compiled modules on disk, so a restart does not recompile its plugins.
//!
//! A compiled module is machine code the process will run, so an entry is loaded only when it
//! is exactly what was written: each file is [`ENTRY_TAG`], the SHA-256 of the serialized
//! module, then the module. Anything else (a flipped bit, a torn or truncated file, a file of
//! another format) is recompiled and the entry rewritten; entries are written to a temporary
//! file, synced, and renamed into place.

use std::hash::{Hash, Hasher};
use std::io::Write;
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
    match std::fs::read(&path).map(|bytes| unseal(&bytes).map(<[u8]>::to_vec)) {
        Ok(Some(serialized)) => {
            // SAFETY: the bytes are, checksum-verified, what `store` wrote from
            // `Module::serialize` for this engine's compatibility hash. wasmtime still checks
            // the header and refuses a module from another version or configuration.
            #[allow(unsafe_code)]
            match unsafe { Module::deserialize(engine, &serialized) } {
                Ok(module) => return Ok(module),
                Err(error) => tracing::warn!(
                    path = %path.display(),
                    %error,
                    "unusable entry in the plugin module cache; recompiling"
                ),
            }
        }
        Ok(None) => tracing::warn!(
            path = %path.display(),
            "damaged entry in the plugin module cache (checksum); recompiling"
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(
            path = %path.display(),
            %error,
            "cannot read the plugin module cache; recompiling"
        ),
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

/// What every entry starts with: the format of the file (the checksum's layout), not wasmtime's.
const ENTRY_TAG: &[u8; 8] = b"concmod1";
const CHECKSUM_BYTES: usize = 32;

/// `serialized` with the tag and its checksum in front.
fn seal(serialized: &[u8]) -> Vec<u8> {
    let mut entry = Vec::with_capacity(ENTRY_TAG.len() + CHECKSUM_BYTES + serialized.len());
    entry.extend_from_slice(ENTRY_TAG);
    entry.extend_from_slice(&Sha256::digest(serialized));
    entry.extend_from_slice(serialized);
    entry
}

/// The serialized module in `entry`, if the tag and the checksum are right.
fn unseal(entry: &[u8]) -> Option<&[u8]> {
    let rest = entry.strip_prefix(ENTRY_TAG)?;
    if rest.len() < CHECKSUM_BYTES {
        return None;
    }
    let (checksum, serialized) = rest.split_at(CHECKSUM_BYTES);
    (Sha256::digest(serialized).as_slice() == checksum).then_some(serialized)
}

/// Writes through a synced temporary file and a rename (then syncs the directory), so a crash
/// leaves either the old entry, none, or the whole new one.
fn store(module: &Module, cache_dir: &Path, path: &Path) -> std::io::Result<()> {
    let serialized = module
        .serialize()
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    std::fs::create_dir_all(cache_dir)?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&seal(&serialized))?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(cache_dir)?.sync_all()
}
