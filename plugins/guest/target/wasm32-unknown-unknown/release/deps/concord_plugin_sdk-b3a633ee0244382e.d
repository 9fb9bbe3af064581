/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_plugin_sdk-b3a633ee0244382e.d: sdk/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_sdk-b3a633ee0244382e.rlib: sdk/src/lib.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_plugin_sdk-b3a633ee0244382e.rmeta: sdk/src/lib.rs

sdk/src/lib.rs:
