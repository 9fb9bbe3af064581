/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_sdk-92017fa5ca3c4a89.d: sdk/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_sdk-92017fa5ca3c4a89.rlib: sdk/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_sdk-92017fa5ca3c4a89.rmeta: sdk/src/lib.rs

sdk/src/lib.rs:
