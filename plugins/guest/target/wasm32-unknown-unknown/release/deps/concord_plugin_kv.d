/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_kv.d: kv/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_kv.wasm: kv/src/lib.rs

kv/src/lib.rs:
