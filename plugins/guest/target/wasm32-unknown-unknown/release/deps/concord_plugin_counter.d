/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_counter.d: counter/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_counter.wasm: counter/src/lib.rs

counter/src/lib.rs:
