/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_kv-c7d3fa0c3db242ef.d: kv/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_kv-c7d3fa0c3db242ef.rmeta: kv/src/lib.rs Cargo.toml

kv/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
