/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_session-9a2fdec9edbbacb6.d: session/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_session-9a2fdec9edbbacb6.rmeta: session/src/lib.rs Cargo.toml

session/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
