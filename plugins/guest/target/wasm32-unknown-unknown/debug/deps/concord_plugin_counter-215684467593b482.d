/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_counter-215684467593b482.d: counter/src/lib.rs Cargo.toml

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_counter-215684467593b482.rmeta: counter/src/lib.rs Cargo.toml

counter/src/lib.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# env-dep:CLIPPY_CONF_DIR
