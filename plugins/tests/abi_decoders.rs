//! The ABI's decoders read buffers the other side of the host/plugin boundary wrote: a broken
//! or hostile plugin (or host) gets a refusal from them, never a panic or a huge allocation.

use concord_plugin_abi::{decode_batch, decode_pairs, encode_batch, encode_pairs};

#[test]
fn hostile_buffers_are_refused_never_a_panic() {
    let mut batch = Vec::new();
    let commands: [&[u8]; 3] = [b"one", b"", &[9; 70]];
    encode_batch(commands.iter().copied(), &mut batch);
    let mut pairs = Vec::new();
    encode_pairs(&[("key", "value"), ("k2", "")], &mut pairs);
    assert_eq!(decode_batch(&batch).unwrap().len(), 3);
    assert_eq!(decode_pairs(&pairs).unwrap().len(), 2);
    for input in concord_storage::testing::hostile_inputs(&[batch, pairs], 11, 3_000) {
        let _ = decode_batch(&input);
        let _ = decode_pairs(&input);
    }
}

/// Sessions and their commands and results are read back from the log and the state (files
/// on disk) and from the plugin's answers: whatever the bytes, a refusal, never a panic or an
/// allocation their lengths ask for.
#[test]
fn hostile_session_records_commands_and_results_are_refused_never_a_panic() {
    use concord_session::{
        ExpireOutcome, LastWill, ListPage, MapStore, Session, SessionCommand, SessionFields,
        SessionPatch, apply_command, expiry_of_record,
    };
    let fields = SessionFields {
        session_expiry_interval_secs: 60,
        clean_start: false,
        last_will: Some(LastWill {
            topic: "devices/gone".into(),
            payload: b"bye".to_vec(),
            qos: 1,
            retain: true,
            delay_interval_secs: 5,
        }),
        broker_id: "broker-1".into(),
        connection_id: 7,
    };
    let create = SessionCommand::Create {
        client_id: "dev/42".into(),
        fields: fields.clone(),
        now_ms: 1_000,
    }
    .encode();
    let update = SessionCommand::Update {
        client_id: "dev/42".into(),
        patch: SessionPatch {
            broker_id: Some("broker-2".into()),
            ..Default::default()
        },
        expected_version: Some(1),
        now_ms: 2_000,
    }
    .encode();
    let mut store = MapStore::default();
    let record = apply_command(&mut store, &create).unwrap();
    let session = Session::decode(&record).unwrap();
    let page = ListPage {
        sessions: vec![session.clone(), session],
        next_start_after: Some("dev/42".into()),
    }
    .encode();
    let outcome = ExpireOutcome {
        expired: vec!["dev/1".into(), "dev/2".into()],
        next_start_after: None,
    }
    .encode();
    let valid = vec![create, update, record, page, outcome];
    for input in concord_storage::testing::hostile_inputs(&valid, 12, 3_000) {
        let _ = SessionCommand::decode(&input);
        let _ = Session::decode(&input);
        let _ = expiry_of_record(&input);
        let _ = ListPage::decode(&input);
        let _ = ExpireOutcome::decode(&input);
        let _ = apply_command(&mut MapStore::default(), &input);
    }
}
