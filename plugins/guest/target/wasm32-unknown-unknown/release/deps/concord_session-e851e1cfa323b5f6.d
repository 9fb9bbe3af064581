/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/concord_session-e851e1cfa323b5f6.d: /work/main/plugins/session/src/lib.rs /work/main/plugins/session/src/codec.rs /work/main/plugins/session/src/command.rs /work/main/plugins/session/src/error.rs /work/main/plugins/session/src/logic.rs /work/main/plugins/session/src/model.rs /work/main/plugins/session/src/store.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_session-e851e1cfa323b5f6.rlib: /work/main/plugins/session/src/lib.rs /work/main/plugins/session/src/codec.rs /work/main/plugins/session/src/command.rs /work/main/plugins/session/src/error.rs /work/main/plugins/session/src/logic.rs /work/main/plugins/session/src/model.rs /work/main/plugins/session/src/store.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/release/deps/libconcord_session-e851e1cfa323b5f6.rmeta: /work/main/plugins/session/src/lib.rs /work/main/plugins/session/src/codec.rs /work/main/plugins/session/src/command.rs /work/main/plugins/session/src/error.rs /work/main/plugins/session/src/logic.rs /work/main/plugins/session/src/model.rs /work/main/plugins/session/src/store.rs

/work/main/plugins/session/src/lib.rs:
/work/main/plugins/session/src/codec.rs:
/work/main/plugins/session/src/command.rs:
/work/main/plugins/session/src/error.rs:
/work/main/plugins/session/src/logic.rs:
/work/main/plugins/session/src/model.rs:
/work/main/plugins/session/src/store.rs:
