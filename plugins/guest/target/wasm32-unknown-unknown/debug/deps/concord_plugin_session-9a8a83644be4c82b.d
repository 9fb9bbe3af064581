/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_session-9a8a83644be4c82b.d: session/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_session-9a8a83644be4c82b.rmeta: session/src/lib.rs Cargo.toml

session/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
