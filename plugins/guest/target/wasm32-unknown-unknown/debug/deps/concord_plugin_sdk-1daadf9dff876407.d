/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_sdk-1daadf9dff876407.d: sdk/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_sdk-1daadf9dff876407.rmeta: sdk/src/lib.rs Cargo.toml

sdk/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
