use crate::*;

fn fields(broker: &str) -> SessionFields {
    SessionFields {
        session_expiry_interval_secs: 60,
        clean_start: false,
        last_will: Some(LastWill {
            topic: "devices/gone".into(),
            payload: b"bye".to_vec(),
            qos: 1,
            retain: true,
            delay_interval_secs: 5,
        }),
        broker_id: broker.into(),
        connection_id: 7,
    }
}

fn run(store: &mut MapStore, command: SessionCommand) -> Result<Vec<u8>, SessionError> {
    apply_command(store, &command.encode())
}

fn create(store: &mut MapStore, id: &str, now_ms: u64) -> Session {
    let bytes = run(
        store,
        SessionCommand::Create {
            client_id: id.into(),
            fields: fields("b1"),
            now_ms,
        },
    )
    .unwrap();
    Session::decode(&bytes).unwrap()
}

#[test]
fn create_get_and_conflict() {
    let mut store = MapStore::default();
    let created = create(&mut store, "c1", 100);
    assert_eq!(
        (
            created.version,
            created.created_at_ms,
            created.updated_at_ms
        ),
        (1, 100, 100)
    );
    let got = run(
        &mut store,
        SessionCommand::Get {
            client_id: "c1".into(),
        },
    )
    .unwrap();
    assert_eq!(Session::decode(&got).unwrap(), created);
    let before = store.clone();
    let error = run(
        &mut store,
        SessionCommand::Create {
            client_id: "c1".into(),
            fields: fields("b2"),
            now_ms: 200,
        },
    )
    .unwrap_err();
    assert_eq!(error.code, code::ALREADY_EXISTS);
    assert_eq!(store, before);
    let missing = run(
        &mut store,
        SessionCommand::Get {
            client_id: "nobody".into(),
        },
    )
    .unwrap_err();
    assert_eq!(missing.code, code::NOT_FOUND);
}

#[test]
fn replace_update_and_delete_honour_the_expected_version() {
    let mut store = MapStore::default();
    create(&mut store, "c1", 100);
    let mismatch = run(
        &mut store,
        SessionCommand::Replace {
            client_id: "c1".into(),
            fields: fields("b2"),
            expected_version: Some(9),
            now_ms: 150,
        },
    )
    .unwrap_err();
    assert_eq!(mismatch.code, code::VERSION_MISMATCH);

    let replaced = Session::decode(
        &run(
            &mut store,
            SessionCommand::Replace {
                client_id: "c1".into(),
                fields: fields("b2"),
                expected_version: Some(1),
                now_ms: 150,
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(replaced.version, 2);
    assert_eq!(replaced.created_at_ms, 100);
    assert_eq!(replaced.updated_at_ms, 150);
    assert_eq!(replaced.fields.broker_id, "b2");

    let updated = Session::decode(
        &run(
            &mut store,
            SessionCommand::Update {
                client_id: "c1".into(),
                patch: SessionPatch {
                    connection_id: Some(99),
                    last_will: Some(None),
                    ..Default::default()
                },
                expected_version: None,
                now_ms: 160,
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(updated.version, 3);
    assert_eq!(updated.fields.connection_id, 99);
    assert_eq!(updated.fields.last_will, None);
    assert_eq!(updated.fields.broker_id, "b2", "untouched fields stay");

    let stale_delete = run(
        &mut store,
        SessionCommand::Delete {
            client_id: "c1".into(),
            expected_version: Some(2),
        },
    )
    .unwrap_err();
    assert_eq!(stale_delete.code, code::VERSION_MISMATCH);
    let deleted = run(
        &mut store,
        SessionCommand::Delete {
            client_id: "c1".into(),
            expected_version: Some(3),
        },
    )
    .unwrap();
    assert_eq!(Session::decode(&deleted).unwrap(), updated);
    assert!(store.map.is_empty());
}

#[test]
fn list_pages_through_a_prefix_in_order() {
    let mut store = MapStore::default();
    for id in ["a/3", "a/1", "b/1", "a/2", "a/4", "a"] {
        create(&mut store, id, 1);
    }
    let mut seen = Vec::new();
    let mut start_after = None;
    for _ in 0..10 {
        let page = ListPage::decode(
            &run(
                &mut store,
                SessionCommand::List {
                    prefix: "a/".into(),
                    start_after: start_after.clone(),
                    limit: 3,
                },
            )
            .unwrap(),
        )
        .unwrap();
        seen.extend(page.sessions.into_iter().map(|s| s.client_id));
        start_after = page.next_start_after;
        if start_after.is_none() {
            break;
        }
    }
    assert_eq!(seen, ["a/1", "a/2", "a/3", "a/4"]);
    let all = ListPage::decode(
        &run(
            &mut store,
            SessionCommand::List {
                prefix: String::new(),
                start_after: None,
                limit: 1000,
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(all.sessions.len(), 6);
    assert_eq!(all.next_start_after, None);
    for limit in [0, 1001] {
        let error = run(
            &mut store,
            SessionCommand::List {
                prefix: String::new(),
                start_after: None,
                limit,
            },
        )
        .unwrap_err();
        assert_eq!(error.code, code::INVALID_FIELD);
        assert!(error.message.starts_with("limit"), "{error}");
    }
}

#[test]
fn expire_removes_only_sessions_past_their_interval() {
    let mut store = MapStore::default();
    let mut disconnected = |id: &str, interval_secs: u32, connection_id: u64, now_ms: u64| {
        let fields = SessionFields {
            session_expiry_interval_secs: interval_secs,
            connection_id,
            ..fields("b1")
        };
        let command = SessionCommand::Create {
            client_id: id.into(),
            fields,
            now_ms,
        };
        run(&mut store, command).unwrap();
    };
    disconnected("old", 60, 0, 1_000); // expires at 61_000
    disconnected("new", 60, 0, 50_000); // expires at 110_000
    // Held by a connection, or ended by the broker with its connection: never by the store.
    disconnected("held", 60, 7, 0);
    disconnected("zero", 0, 0, 0);
    run(
        &mut store,
        SessionCommand::Update {
            client_id: "forever".into(),
            patch: SessionPatch::default(),
            expected_version: None,
            now_ms: 0,
        },
    )
    .unwrap_err();
    let forever = SessionCommand::Create {
        client_id: "forever".into(),
        fields: SessionFields {
            session_expiry_interval_secs: NEVER_EXPIRES,
            ..Default::default()
        },
        now_ms: 0,
    };
    run(&mut store, forever).unwrap();
    let outcome = ExpireOutcome::decode(
        &run(
            &mut store,
            SessionCommand::Expire {
                now_ms: 61_000,
                start_after: None,
                scan_limit: 2,
            },
        )
        .unwrap(),
    )
    .unwrap();
    // Two examined ("forever", "held"): nothing expired yet, more to see.
    assert!(outcome.expired.is_empty());
    assert_eq!(outcome.next_start_after.as_deref(), Some("held"));
    let outcome = ExpireOutcome::decode(
        &run(
            &mut store,
            SessionCommand::Expire {
                now_ms: 61_000,
                start_after: outcome.next_start_after,
                scan_limit: 2,
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(outcome.expired, ["old"]);
    assert_eq!(outcome.next_start_after.as_deref(), Some("old"));
    let outcome = ExpireOutcome::decode(
        &run(
            &mut store,
            SessionCommand::Expire {
                now_ms: 10_000_000,
                start_after: None,
                scan_limit: 10,
            },
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(outcome.expired, ["new"]);
    assert_eq!(outcome.next_start_after, None);
    assert_eq!(store.map.len(), 3, "forever, held and zero stay");
}

#[test]
fn invalid_fields_are_named() {
    let mut store = MapStore::default();
    let cases: Vec<(SessionCommand, &str)> = vec![
        (
            SessionCommand::Get {
                client_id: String::new(),
            },
            "client_id",
        ),
        (
            SessionCommand::Get {
                client_id: "x".repeat(257),
            },
            "client_id",
        ),
        (
            SessionCommand::Create {
                client_id: "c".into(),
                fields: SessionFields {
                    broker_id: "b".repeat(300),
                    ..Default::default()
                },
                now_ms: 0,
            },
            "broker_id",
        ),
        (
            SessionCommand::Create {
                client_id: "c".into(),
                fields: SessionFields {
                    last_will: Some(LastWill {
                        topic: "t".into(),
                        payload: vec![],
                        qos: 3,
                        retain: false,
                        delay_interval_secs: 0,
                    }),
                    ..Default::default()
                },
                now_ms: 0,
            },
            "last_will.qos",
        ),
    ];
    for (command, field) in cases {
        let error = run(&mut store, command).unwrap_err();
        assert_eq!(error.code, code::INVALID_FIELD);
        assert_eq!(error.invalid_field(), Some(field), "{error}");
    }
    assert!(store.map.is_empty());
    // Other errors name no field.
    assert_eq!(SessionError::malformed("x: y").invalid_field(), None);
}

#[test]
fn damaged_commands_are_malformed_never_a_panic() {
    let mut store = MapStore::default();
    let command = SessionCommand::Update {
        client_id: "c1".into(),
        patch: SessionPatch {
            last_will: Some(Some(fields("b").last_will.unwrap())),
            broker_id: Some("b".into()),
            ..Default::default()
        },
        expected_version: Some(3),
        now_ms: 5,
    }
    .encode();
    assert_eq!(
        SessionCommand::decode(&command).unwrap(),
        SessionCommand::decode(&command.clone()).unwrap()
    );
    for cut in 0..command.len() {
        let error = apply_command(&mut store, &command[..cut]).unwrap_err();
        assert_eq!(error.code, code::MALFORMED, "cut at {cut}");
    }
    for position in 0..command.len() {
        let mut damaged = command.clone();
        damaged[position] ^= 0xff;
        let _ = apply_command(&mut store, &damaged);
    }
    let mut longer = command.clone();
    longer.push(0);
    assert_eq!(
        apply_command(&mut store, &longer).unwrap_err().code,
        code::MALFORMED
    );
}

#[test]
fn a_records_expiry_read_from_its_bytes_agrees_with_the_session() {
    let mut cases = Vec::new();
    for interval in [0, 1, 60, NEVER_EXPIRES] {
        for connection_id in [0, 7] {
            for last_will in [None, fields("b").last_will] {
                cases.push(Session {
                    client_id: "device/ü-1".into(),
                    fields: SessionFields {
                        session_expiry_interval_secs: interval,
                        connection_id,
                        last_will,
                        ..fields("broker-9")
                    },
                    created_at_ms: 1_000,
                    updated_at_ms: 5_000,
                    version: 3,
                });
            }
        }
    }
    for session in cases {
        let expiry = expiry_of_record(&session.encode()).unwrap();
        assert_eq!(expiry, session.expiry());
        match expiry {
            Some(SessionExpiry {
                expires_at_ms,
                version,
            }) => {
                assert_eq!(version, 3);
                assert!(!session.is_expired(expires_at_ms - 1), "{session:?}");
                assert!(session.is_expired(expires_at_ms), "{session:?}");
            }
            None => assert!(!session.is_expired(u64::MAX), "{session:?}"),
        }
    }
    // Damaged bytes are an error, never a panic.
    let whole = create(&mut MapStore::default(), "c", 1).encode();
    for cut in 0..whole.len() {
        assert!(expiry_of_record(&whole[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = whole.clone();
    longer.push(0);
    assert!(expiry_of_record(&longer).is_err());
}
