//! The embeddable engine end to end: session CRUD with every error, listing across groups,
//! consistency levels, restart, and configurations that must be refused.

use concord_engine::storage::BackendKind;
use concord_engine::{
    ConsensusKind, Consistency, Engine, EngineConfig, EngineError, LastWill, MAX_RAFT_TICK,
    MIN_RAFT_TICK, MIN_STATE_CACHE_BYTES, ProposeError, SessionFields, SessionPatch,
    StateMachineSource, VOTE_QUIET_FILE, is_session_error, session_code,
};

fn config(dir: &std::path::Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.groups = 4;
    config
}

fn fields(broker: &str) -> SessionFields {
    SessionFields {
        session_expiry_interval_secs: 60,
        clean_start: false,
        last_will: Some(LastWill {
            topic: "status/offline".into(),
            payload: b"bye".to_vec(),
            qos: 1,
            retain: true,
            delay_interval_secs: 0,
        }),
        broker_id: broker.into(),
        connection_id: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_crud_with_every_error_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let engine = Engine::open(config(dir.path())).unwrap();
        let sessions = engine.sessions().unwrap();

        let created = sessions.create("dev/1", fields("b1")).await.unwrap();
        assert_eq!(created.version, 1);
        assert_eq!(created.created_at_ms, created.updated_at_ms);
        let again = sessions.create("dev/1", fields("b1")).await.unwrap_err();
        assert!(
            is_session_error(&again, session_code::ALREADY_EXISTS),
            "{again}"
        );

        let missing = sessions.get("dev/none", Consistency::Linearizable).await;
        assert!(is_session_error(
            &missing.unwrap_err(),
            session_code::NOT_FOUND
        ));

        let stale = sessions
            .replace("dev/1", fields("b2"), Some(7))
            .await
            .unwrap_err();
        assert!(
            is_session_error(&stale, session_code::VERSION_MISMATCH),
            "{stale}"
        );
        let replaced = sessions
            .replace("dev/1", fields("b2"), Some(1))
            .await
            .unwrap();
        assert_eq!(
            (replaced.version, replaced.fields.broker_id.as_str()),
            (2, "b2")
        );

        let patch = SessionPatch {
            connection_id: Some(9),
            ..SessionPatch::default()
        };
        let updated = sessions.update("dev/1", patch, None).await.unwrap();
        assert_eq!((updated.version, updated.fields.connection_id), (3, 9));
        assert_eq!(updated.fields.broker_id, "b2", "a patch keeps other fields");

        let mut bad = fields("b1");
        bad.last_will.as_mut().unwrap().qos = 3;
        let invalid = sessions.create("dev/2", bad).await.unwrap_err();
        assert!(is_session_error(&invalid, session_code::INVALID_FIELD));
        assert!(invalid.to_string().contains("last_will.qos"), "{invalid}");
        let empty_id = sessions.create("", fields("b1")).await.unwrap_err();
        assert!(
            is_session_error(&empty_id, session_code::INVALID_FIELD),
            "{empty_id}"
        );

        for consistency in [
            Consistency::Linearizable,
            Consistency::Lease,
            Consistency::Stale,
        ] {
            let read = sessions.get("dev/1", consistency).await.unwrap();
            assert_eq!(read, updated, "{consistency:?}");
        }

        sessions.create("dev/3", fields("b1")).await.unwrap();
        let deleted = sessions.delete("dev/3", Some(1)).await.unwrap();
        assert_eq!(deleted.client_id, "dev/3");
        let gone = sessions.delete("dev/3", None).await.unwrap_err();
        assert!(is_session_error(&gone, session_code::NOT_FOUND));
        engine.shutdown().expect("the engine stops");
    }
    let engine = Engine::open(config(dir.path())).unwrap();
    let read = engine
        .sessions()
        .unwrap()
        .get("dev/1", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!((read.version, read.fields.connection_id), (3, 9));
}

/// Reads of a group id the engine does not run are refused, at every consistency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_engine_does_not_run_is_refused_at_every_consistency() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let last = *engine.group_ids().last().unwrap();
    for group in [last + 1, 1_000_000] {
        for consistency in [
            Consistency::Linearizable,
            Consistency::Lease,
            Consistency::Stale,
        ] {
            let refused = engine.ready_to_read(group, consistency).await.unwrap_err();
            assert!(
                matches!(
                    refused,
                    EngineError::Propose(ProposeError::UnknownGroup { group: g }) if g == group
                ),
                "{consistency:?}: {refused}"
            );
        }
        assert!(engine.state_digest(group).is_err());
    }
    engine
        .ready_to_read(last, Consistency::Stale)
        .await
        .unwrap();
    engine.state_digest(last).unwrap();
    engine.shutdown().expect("the engine stops");
}

/// Many creates at once over every group: each input gets its own answer in its place, an
/// invalid one and a duplicate fail alone, and what was answered survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_many_answers_each_session_in_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let sessions = engine.sessions().unwrap();
    sessions.create("dev/7", fields("b")).await.unwrap();
    let ids: Vec<String> = (0..40)
        .map(|n| format!("dev/{n}"))
        .chain(["bad\0id".to_string()])
        .collect();
    let groups_used: std::collections::BTreeSet<u64> = ids
        .iter()
        .map(|id| engine.group_of(id.as_bytes()))
        .collect();
    assert_eq!(groups_used.len(), 4, "the ids must spread over every group");

    let created = sessions
        .create_many(ids.iter().map(|id| (id.clone(), fields("b"))).collect())
        .await;
    assert_eq!(created.len(), ids.len());
    for (id, result) in ids.iter().zip(&created) {
        match id.as_str() {
            "dev/7" => assert!(
                matches!(result, Err(e) if is_session_error(e, session_code::ALREADY_EXISTS)),
                "{result:?}"
            ),
            "bad\0id" => assert!(matches!(result, Err(EngineError::Session(_))), "{result:?}"),
            _ => assert_eq!(result.as_ref().unwrap().client_id, *id),
        }
    }
    engine.shutdown().expect("the engine stops");
    drop(engine);

    let engine = Engine::open(config(dir.path())).unwrap();
    let sessions = engine.sessions().unwrap();
    for id in &ids[..40] {
        let read = sessions.get(id, Consistency::Linearizable).await.unwrap();
        assert_eq!(read.client_id, *id);
    }
    engine.shutdown().expect("the engine stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_through_every_group_in_client_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.backend = Some(BackendKind::Memory);
    config.state_machine = StateMachineSource::NativeSession;
    let engine = Engine::open(config).unwrap();
    let sessions = engine.sessions().unwrap();
    let mut expected = Vec::new();
    for n in 0..37 {
        let id = format!("room/{n:03}");
        sessions.create(&id, fields("b")).await.unwrap();
        expected.push(id);
        sessions
            .create(&format!("dev/{n}"), fields("b"))
            .await
            .unwrap();
    }
    let groups_used: std::collections::BTreeSet<u64> = expected
        .iter()
        .map(|id| engine.group_of(id.as_bytes()))
        .collect();
    assert_eq!(groups_used.len(), 4, "the ids must spread over every group");

    let mut listed = Vec::new();
    let mut start_after: Option<String> = None;
    for _page in 0..10 {
        let page = sessions
            .list(
                "room/",
                start_after.as_deref(),
                10,
                Consistency::Linearizable,
            )
            .await
            .unwrap();
        assert!(page.sessions.len() <= 10);
        listed.extend(page.sessions.into_iter().map(|s| s.client_id));
        start_after = page.next_start_after;
        if start_after.is_none() {
            break;
        }
    }
    assert_eq!(listed, expected);
    let too_many = sessions
        .list("", None, 1001, Consistency::Stale)
        .await
        .unwrap_err();
    assert!(is_session_error(&too_many, session_code::INVALID_FIELD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_removes_only_sessions_past_their_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.backend = Some(BackendKind::Memory);
    config.consensus = ConsensusKind::Solo;
    let engine = Engine::open(config).unwrap();
    let sessions = engine.sessions().unwrap();
    // Disconnected (connection 0) with a lifetime of a second: expired five seconds on.
    let short = SessionFields {
        session_expiry_interval_secs: 1,
        connection_id: 0,
        ..fields("b")
    };
    // The same lifetime, still held by a connection: the store leaves it alone.
    let held = SessionFields {
        session_expiry_interval_secs: 1,
        ..fields("b")
    };
    for n in 0..6 {
        sessions
            .create(&format!("short/{n}"), short.clone())
            .await
            .unwrap();
        sessions
            .create(&format!("long/{n}"), fields("b"))
            .await
            .unwrap();
    }
    sessions.create("long/held", held).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut expired = sessions.expire(now + 5_000).await.unwrap();
    expired.sort();
    let expected: Vec<String> = (0..6).map(|n| format!("short/{n}")).collect();
    assert_eq!(expired, expected);
    let left = sessions
        .list("", None, 100, Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(left.sessions.len(), 7);
    assert!(
        left.sessions
            .iter()
            .all(|s| s.client_id.starts_with("long/"))
    );
}

/// A state cache a fraction of the state's size: every session is read back, through the
/// small cache and, after a restart, through the default one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_cache_smaller_than_the_state_loses_nothing() {
    const SESSIONS: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    // About 8 KiB a session: 3 MiB of state against a cache of 1 MiB.
    let large = |n: usize| SessionFields {
        last_will: Some(LastWill {
            topic: format!("status/{n}"),
            payload: vec![n as u8; 8 * 1024],
            qos: 1,
            retain: false,
            delay_interval_secs: 0,
        }),
        ..fields("b")
    };
    {
        let mut small_cache = config(dir.path());
        small_cache.backend = Some(BackendKind::Redb);
        small_cache.state_cache_bytes = MIN_STATE_CACHE_BYTES;
        let engine = Engine::open(small_cache).unwrap();
        let sessions = engine.sessions().unwrap();
        for n in 0..SESSIONS {
            sessions
                .create(&format!("big/{n}"), large(n))
                .await
                .unwrap();
        }
        for n in (0..SESSIONS).step_by(7) {
            let read = sessions.get(&format!("big/{n}"), Consistency::Stale).await;
            assert_eq!(read.unwrap().fields, large(n), "session {n}");
        }
        engine.shutdown().expect("the engine stops");
    }
    let engine = Engine::open(config(dir.path())).unwrap();
    let sessions = engine.sessions().unwrap();
    for n in 0..SESSIONS {
        let read = sessions.get(&format!("big/{n}"), Consistency::Stale).await;
        assert_eq!(
            read.unwrap().fields,
            large(n),
            "session {n} after the restart"
        );
    }
}

/// `health` reads every group and says what `is_ready` says: ready once each group has its
/// leader, not ready once the engine is shut down.
#[test]
fn the_health_of_every_group_adds_up_to_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !engine.is_ready() {
        assert!(std::time::Instant::now() < deadline, "never ready");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let health = engine.health();
    assert!(health.ready);
    let groups: Vec<u64> = health.groups.iter().map(|(group, _)| *group).collect();
    assert_eq!(groups, engine.group_ids());
    for (group, group_health) in &health.groups {
        assert_eq!(group_health.leader, engine.node_id(), "group {group}");
        assert!(
            group_health.is_leader && !group_health.stopped,
            "group {group}"
        );
        assert!(!group_health.changing_membership, "group {group}");
    }
    engine.shutdown().expect("the engine stops");
    assert!(!engine.is_ready());
    assert!(!engine.health().ready);
}

#[test]
fn configurations_that_cannot_work_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    drop(Engine::open(config(dir.path())).unwrap());
    let mut other_count = config(dir.path());
    other_count.groups = 5;
    let error = Engine::open(other_count).unwrap_err();
    assert!(matches!(error, EngineError::Layout { .. }), "{error}");
    assert!(
        error.to_string().contains("created with 4 groups"),
        "{error}"
    );

    let mut zero = config(dir.path());
    zero.groups = 0;
    assert!(matches!(
        Engine::open(zero).unwrap_err(),
        EngineError::Config(_)
    ));
    let mut tiny_cache = config(dir.path());
    tiny_cache.state_cache_bytes = MIN_STATE_CACHE_BYTES - 1;
    assert!(matches!(
        Engine::open(tiny_cache).unwrap_err(),
        EngineError::Config(message) if message.contains("state_cache_bytes")
    ));
    for tick in [MIN_RAFT_TICK / 2, MAX_RAFT_TICK * 2] {
        let mut odd_tick = config(dir.path());
        odd_tick.raft_tick = tick;
        assert!(matches!(
            Engine::open(odd_tick).unwrap_err(),
            EngineError::Config(message) if message.contains("raft_tick")
        ));
    }

    let not_wasm = dir.path().join("plugin.wasm");
    std::fs::write(&not_wasm, b"definitely not wasm").unwrap();
    let mut bad_plugin = config(&dir.path().join("other"));
    bad_plugin.state_machine = StateMachineSource::PluginFile(not_wasm);
    let error = Engine::open(bad_plugin).unwrap_err();
    assert!(matches!(error, EngineError::Plugin(_)), "{error}");

    let mut missing = config(&dir.path().join("third"));
    missing.state_machine = StateMachineSource::PluginFile(dir.path().join("absent.wasm"));
    let error = Engine::open(missing).unwrap_err();
    assert!(error.to_string().contains("absent.wasm"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_keeps_the_backend_it_was_made_with() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = Engine::open(config(&dir.path().join("fresh"))).unwrap();
    assert_eq!(
        fresh.backend(),
        BackendKind::Wal,
        "a new directory's default"
    );
    fresh.shutdown().expect("the engine stops");

    let made_with_redb = dir.path().join("redb");
    {
        let mut redb = config(&made_with_redb);
        redb.backend = Some(BackendKind::Redb);
        let engine = Engine::open(redb).unwrap();
        let sessions = engine.sessions().unwrap();
        sessions.create("dev/kept", fields("b1")).await.unwrap();
        engine.shutdown().expect("the engine stops");
    }
    // No backend named: the directory's own, with its data.
    let engine = Engine::open(config(&made_with_redb)).unwrap();
    assert_eq!(engine.backend(), BackendKind::Redb);
    assert_eq!(engine.config().backend, Some(BackendKind::Redb));
    let read = engine.sessions().unwrap();
    let kept = read
        .get("dev/kept", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(kept.fields.broker_id, "b1");
    engine.shutdown().expect("the engine stops");

    let mut other = config(&made_with_redb);
    other.backend = Some(BackendKind::Wal);
    let error = Engine::open(other).unwrap_err();
    assert!(
        error.to_string().contains("written by the redb backend"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_plugin_runs_through_propose() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.backend = Some(BackendKind::Memory);
    config.state_machine = StateMachineSource::PluginBytes {
        name: "counter".into(),
        wasm: concord_plugins_counter(),
    };
    let engine = Engine::open(config).unwrap();
    assert!(matches!(engine.sessions(), Err(EngineError::NotSessions)));
    let mut total = 0;
    for _ in 0..3 {
        let result = engine
            .propose(
                b"my-counter",
                bytes::Bytes::from(5i64.to_le_bytes().to_vec()),
            )
            .await
            .unwrap();
        total = i64::from_le_bytes(result.as_ref().try_into().unwrap());
    }
    assert_eq!(total, 15);
    let malformed = engine
        .propose(b"my-counter", bytes::Bytes::from_static(b"abc"))
        .await
        .unwrap_err();
    assert!(
        matches!(malformed, EngineError::Command { code: 1, .. }),
        "{malformed}"
    );
    assert!(engine.is_ready());
}

fn concord_plugins_counter() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/plugins/counter.wasm"
    ))
    .unwrap()
}

/// The data records its plugin: the session logic opens as wasm or native alike (one logic,
/// shipped with the binary), but data written by one plugin refuses another, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_written_by_one_plugin_refuses_another() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = Engine::open(config(dir.path())).unwrap();
    sessions
        .sessions()
        .unwrap()
        .create("dev/1", fields("b"))
        .await
        .unwrap();
    sessions.shutdown().expect("the engine stops");
    drop(sessions);
    let mut native = config(dir.path());
    native.state_machine = StateMachineSource::NativeSession;
    let native = Engine::open(native).unwrap();
    let found = native
        .sessions()
        .unwrap()
        .get("dev/1", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(found.fields.broker_id, "b");
    native.shutdown().expect("the engine stops");
    drop(native);

    let mut counter = config(dir.path());
    counter.state_machine = StateMachineSource::PluginBytes {
        name: "counter".into(),
        wasm: concord_plugins_counter(),
    };
    match Engine::open(counter) {
        Err(EngineError::PluginMismatch {
            recorded,
            configured,
            ..
        }) => {
            assert_eq!(recorded, "bundled:session");
            assert!(configured.starts_with("sha256:"), "{configured}");
        }
        Err(other) => panic!("expected a plugin mismatch, got {other}"),
        Ok(_) => panic!("opened session data with the counter plugin"),
    }
}

/// The main groups of an embedder's own plugin are upgraded through the log like a served
/// plugin; the bundled session logic is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_groups_of_a_plugin_file_upgrade_through_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let kv = |dir: &std::path::Path| {
        let mut config = config(dir);
        config.state_machine = StateMachineSource::PluginBytes {
            name: "kv".into(),
            wasm: fixture("kv.wasm"),
        };
        config
    };
    let put = |value: &str| {
        let mut command = vec![1, 1, 0, b'k'];
        command.extend_from_slice(value.as_bytes());
        bytes::Bytes::from(command)
    };
    let engine = Engine::open(kv(dir.path())).unwrap();
    engine.propose(b"k", put("one")).await.unwrap();
    let identity = engine
        .upgrade_plugin("kv", &fixture("kv-v2.wasm"))
        .await
        .unwrap();
    assert_eq!(
        engine.plugin().map(|p| format!("sha256:{}", p.sha256())),
        Some(identity)
    );
    engine.propose(b"k", put("two")).await.unwrap();
    // The kv plugin's get: op 3, the key's length, the key.
    let value = engine
        .propose(b"k", bytes::Bytes::from_static(&[3, 1, 0, b'k']))
        .await
        .unwrap();
    assert_eq!(value.as_ref(), b"v2:two");
    assert!(matches!(
        engine.upgrade_plugin("nope", b"").await,
        Err(EngineError::UnknownPlugin { .. })
    ));
    engine.shutdown().expect("the engine stops");
    drop(engine);

    let sessions_dir = tempfile::tempdir().unwrap();
    let sessions = Engine::open(config(sessions_dir.path())).unwrap();
    assert!(matches!(
        sessions
            .upgrade_plugin("session", &fixture("kv-v2.wasm"))
            .await,
        Err(EngineError::UpgradeRefused { .. })
    ));
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../fixtures/plugins/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// A cluster member on a store that keeps its data records the vote quiet it says to its
/// peers. Restarted with shorter ticks, it keeps the longer quiet on record (and holds its
/// vote for it) until that has passed, then records its new one.
#[test]
fn a_cluster_member_keeps_the_longer_vote_quiet_on_record_until_it_passed() {
    let dir = tempfile::tempdir().unwrap();
    let raft_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let member = |tick_ms: u64| {
        let mut config = config(dir.path());
        config.backend = Some(BackendKind::Redb);
        config.raft_tick = std::time::Duration::from_millis(tick_ms);
        config.cluster = Some(concord_engine::ClusterConfig {
            cluster_id: 7,
            node_id: 1,
            members: [(1, raft_addr)].into(),
            listen_addr: None,
            client_url: None,
            joins_existing: false,
            tls: None,
        });
        config
    };
    let recorded = || std::fs::read_to_string(dir.path().join(VOTE_QUIET_FILE)).unwrap();
    // Ticks of 100 ms, elections after 10: a quiet of 9 ticks.
    let engine = Engine::open(member(100)).unwrap();
    assert_eq!(recorded(), "vote_quiet_ms = 900\n");
    engine.shutdown().expect("the engine stops");
    drop(engine);

    let started = std::time::Instant::now();
    let engine = Engine::open(member(20)).unwrap();
    assert_eq!(recorded(), "vote_quiet_ms = 900\n", "kept while it may run");
    let deadline = started + std::time::Duration::from_secs(10);
    while recorded() != "vote_quiet_ms = 180\n" {
        assert!(std::time::Instant::now() < deadline, "{}", recorded());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    engine.shutdown().expect("the engine stops");
}
