/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_counter-a5961b5943f59a07.d: counter/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_counter-a5961b5943f59a07.rmeta: counter/src/lib.rs Cargo.toml

counter/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
