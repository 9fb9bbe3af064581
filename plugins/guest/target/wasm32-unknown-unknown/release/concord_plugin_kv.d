/work/main/plugins/guest/target/wasm32-unknown-unknown/release/concord_plugin_kv.wasm: /work/main/plugins/abi/src/lib.rs /work/main/plugins/guest/kv/src/lib.rs /work/main/plugins/guest/sdk/src/lib.rs
