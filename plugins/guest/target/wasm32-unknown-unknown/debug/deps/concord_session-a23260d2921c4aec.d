/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/concord_session-a23260d2921c4aec.d: /work/main/plugins/session/src/lib.rs /work/main/plugins/session/src/codec.rs /work/main/plugins/session/src/command.rs /work/main/plugins/session/src/error.rs /work/main/plugins/session/src/logic.rs /work/main/plugins/session/src/model.rs /work/main/plugins/session/src/store.rs

/work/main/plugins/guest/target/wasm32-unknown-unknown/debug/deps/libconcord_session-a23260d2921c4aec.rmeta: /work/main/plugins/session/src/lib.rs /work/main/plugins/session/src/codec.rs /work/main/plugins/session/src/command.rs /work/main/plugins/session/src/error.rs /work/main/plugins/session/src/logic.rs /work/main/plugins/session/src/model.rs /work/main/plugins/session/src/store.rs

/work/main/plugins/session/src/lib.rs:
/work/main/plugins/session/src/codec.rs:
/work/main/plugins/session/src/command.rs:
/work/main/plugins/session/src/error.rs:
/work/main/plugins/session/src/logic.rs:
/work/main/plugins/session/src/model.rs:
/work/main/plugins/session/src/store.rs:
