/work/main/plugins/guest/target/wasm32-unknown-unknown/release/libconcord_plugin_sdk.rlib: /work/main/plugins/abi/src/lib.rs /work/main/plugins/guest/sdk/src/lib.rs
