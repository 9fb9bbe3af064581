/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_session.d: session/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_session.wasm: session/src/lib.rs

session/src/lib.rs:
