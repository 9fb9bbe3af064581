/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_abi-65c8fe3b7e3f43e7.d: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_abi-65c8fe3b7e3f43e7.rlib: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_abi-65c8fe3b7e3f43e7.rmeta: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/abi/src/lib.rs:
