/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_plugin_abi-09287ea1aff19eb0.d: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_plugin_abi-09287ea1aff19eb0.rmeta: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/abi/src/lib.rs:
