/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_abi-8506bf4ef3be5f40.d: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_abi-8506bf4ef3be5f40.rlib: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_abi-8506bf4ef3be5f40.rmeta: /work/main/plugins/abi/src/lib.rs

/work/main/plugins/abi/src/lib.rs:
