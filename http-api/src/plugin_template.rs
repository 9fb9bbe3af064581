//! What `concord plugin new <dir>` writes: a plugin project that builds on its own — the plugin crate, and
//! the guest SDK and ABI crates of this Concord version copied beside it (path dependencies,
//! nothing fetched) — with the build flags the host expects and a README that goes from
//! build to serve to call.

use std::path::Path;

const SDK_LIB: &str = include_str!("../../plugins/guest/sdk/src/lib.rs");
const SDK_ALLOCATOR: &str = include_str!("../../plugins/guest/sdk/src/allocator.rs");
const ABI_LIB: &str = include_str!("../../plugins/guest/abi/src/lib.rs");

/// The crate name the directory's name gives: `a-z`, `0-9`, `-`, `_`, starting with a letter.
pub(crate) fn plugin_name(dir: &Path) -> Result<String, String> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.len() <= 64;
    if !valid {
        return Err(format!(
            "{}: the directory's name names the plugin: a letter, then up to 63 of a-z, 0-9, - and _",
            dir.display()
        ));
    }
    Ok(name)
}

pub(crate) fn write_project(dir: &Path, name: &str) -> Result<(), String> {
    if dir.exists() {
        return Err(format!("{} exists; give a new directory", dir.display()));
    }
    let crate_name = name.replace('-', "_");
    let files: [(&str, String); 10] = [
        ("Cargo.toml", workspace_manifest(name)),
        (".cargo/config.toml", CARGO_CONFIG.into()),
        ("README.md", readme(name, &crate_name)),
        ("plugin/Cargo.toml", plugin_manifest(name)),
        ("plugin/src/lib.rs", PLUGIN_LIB.into()),
        ("sdk/Cargo.toml", SDK_MANIFEST.into()),
        ("sdk/src/lib.rs", SDK_LIB.into()),
        ("sdk/src/allocator.rs", SDK_ALLOCATOR.into()),
        ("abi/Cargo.toml", ABI_MANIFEST.into()),
        ("abi/src/lib.rs", ABI_LIB.into()),
    ];
    for (path, text) in &files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| format!("{}: {error}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(())
}

fn workspace_manifest(name: &str) -> String {
    format!(
        r#"# The {name} plugin for Concord, with the guest SDK and ABI it was made with.
[workspace]
resolver = "3"
members = ["plugin", "sdk", "abi"]

[workspace.package]
version = "0.1.0"
edition = "2024"
publish = false

# Small modules; a panic is a trap, which the host turns into that command's error.
[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
debug = false
strip = true
"#
    )
}

fn plugin_manifest(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version.workspace = true
edition.workspace = true
publish.workspace = true

[lib]
crate-type = ["cdylib"]

[dependencies]
concord-plugin-sdk = {{ path = "../sdk" }}
"#
    )
}

const SDK_MANIFEST: &str = r#"[package]
name = "concord-plugin-sdk"
description = "Write a Concord state-machine plugin as a page of ordinary Rust."
version.workspace = true
edition.workspace = true
publish.workspace = true

[dependencies]
concord-plugin-abi = { path = "../abi" }

[features]
default = ["allocator"]
# Install the SDK's size-class allocator as the plugin's global allocator.
allocator = []
"#;

const ABI_MANIFEST: &str = r#"[package]
name = "concord-plugin-abi"
description = "The binary interface between Concord's wasm host and its state-machine plugins."
version.workspace = true
edition.workspace = true
publish.workspace = true
"#;

/// The target and the 64 KiB stack: the host resets the first 128 KiB of an instance's
/// memory in place between batches, so the stack and statics belong there.
const CARGO_CONFIG: &str = r#"[build]
target = "wasm32-unknown-unknown"

[target.wasm32-unknown-unknown]
rustflags = ["-C", "link-arg=-zstack-size=65536"]
"#;

const PLUGIN_LIB: &str = r#"//! A key-value plugin: each command is text, `put <key> <value>`, `get <key>` or
//! `delete <key>`. The value comes back as the result; errors have codes of your choosing
//! (below 1000: the host's faults start there).
//!
//! State lives in the group's store (`kv::*`), never in statics: every batch runs in a fresh
//! instance, and every replica must compute the same results.

use concord_plugin_sdk::{CommandError, export_plugin, kv};

const MALFORMED: u32 = 1;
const NOT_FOUND: u32 = 2;

fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
    let text = std::str::from_utf8(command)
        .map_err(|_| CommandError::new(MALFORMED, "a command is UTF-8 text"))?;
    let mut words = text.splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("put"), Some(key), Some(value)) => {
            kv::put(key.as_bytes(), value.as_bytes())?;
            Ok(value.as_bytes().to_vec())
        }
        (Some("get"), Some(key), None) => kv::get(key.as_bytes())?
            .ok_or_else(|| CommandError::new(NOT_FOUND, format!("no value under {key:?}"))),
        (Some("delete"), Some(key), None) => {
            let old = kv::get(key.as_bytes())?.unwrap_or_default();
            kv::delete(key.as_bytes())?;
            Ok(old)
        }
        _ => Err(CommandError::new(
            MALFORMED,
            "expected `put <key> <value>`, `get <key>` or `delete <key>`",
        )),
    }
}

export_plugin!(apply);
"#;

fn readme(name: &str, crate_name: &str) -> String {
    format!(
        r#"# {name}

A state machine for Concord, as a WebAssembly plugin: `plugin/src/lib.rs` is all of it. `sdk/`
and `abi/` are the guest SDK and ABI of the Concord version that wrote this project.

## Build

With Rust 1.95 or later:

```sh
rustup target add wasm32-unknown-unknown   # once
cargo build --release                      # -> target/wasm32-unknown-unknown/release/{crate_name}.wasm
```

`.cargo/config.toml` builds for wasm32 with a 64 KiB stack (the host resets the first 128 KiB
of a plugin's memory between batches; a plugin that fits there costs less per batch).

## Serve

```sh
concord serve --plugin {name}=target/wasm32-unknown-unknown/release/{crate_name}.wasm
```

The plugin gets groups of its own (`--plugin-groups`, 4 by default) beside the sessions; every
member of a cluster serves it from the same file. Plugins may be added later, after the others;
not removed or reordered.

## Call

```sh
curl -s --data-binary 'put greeting hello' -H 'content-type: application/octet-stream' \
    'http://127.0.0.1:7070/v1/plugins/{name}/commands?key=greeting'          # hello
curl -s 'http://127.0.0.1:7070/v1/plugins/{name}/keys/greeting'              # hello
curl -s --data-binary 'get nothing' -H 'content-type: application/octet-stream' \
    'http://127.0.0.1:7070/v1/plugins/{name}/commands?key=nothing'           # 422, code 2
curl -s http://127.0.0.1:7070/v1/plugins                                     # module hash, counts
```

`?key=` picks the group the command goes to; a command that writes the key it is routed by can
be read back at `/v1/plugins/{name}/keys/<key>` (`?consistency=linearizable|lease|stale`). JSON
works too: `{{"key": "greeting", "command_base64": "..."}}` to `/v1/plugins/{name}/commands`,
and up to 1000 commands at once to `/v1/plugins/{name}/commands/batch`.

## Change it

Build the new version and upgrade the running plugin through the log (every member switches at
the same entry; the data keeps the module, so restarts run it even with the old file named):

```sh
curl -s -X PUT --data-binary @target/wasm32-unknown-unknown/release/{crate_name}.wasm \
    -H 'content-type: application/wasm' http://127.0.0.1:7070/v1/plugins/{name}
```

To move data to a new layout at the switch, export a migration:
`export_plugin!(apply, migrate = migrate)`, where `migrate` gets the identity of the module it
replaces and writes with `kv::*` in the upgrade's own transaction (an error refuses the upgrade).

## Rules

- Commands must give the same result on every replica: no clock, no randomness (the wasm
  target has none to import); a time the logic needs travels in the command.
- State lives in the store (`kv::get/put/delete/scan`), nothing else survives a batch.
- A command that fails returns a `CommandError` (code 1–999); its writes are discarded, the
  other commands of its batch still apply. Running out of fuel, memory or stack, or panicking,
  fails only that command (codes 1000 and up).
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_is_written_once_under_a_valid_name() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("my-notes");
        write_project(&dir, &plugin_name(&dir).unwrap()).unwrap();
        let manifest = std::fs::read_to_string(dir.join("plugin/Cargo.toml")).unwrap();
        assert!(manifest.contains(r#"name = "my-notes""#), "{manifest}");
        assert_eq!(
            std::fs::read_to_string(dir.join("sdk/src/lib.rs")).unwrap(),
            SDK_LIB
        );
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("release/my_notes.wasm"), "{readme}");
        assert!(
            write_project(&dir, "my-notes")
                .unwrap_err()
                .contains("exists")
        );
        assert!(plugin_name(Path::new("/tmp/9lives")).is_err());
        assert!(plugin_name(Path::new("/tmp/has space")).is_err());
    }
}
