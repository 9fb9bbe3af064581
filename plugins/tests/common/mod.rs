//! Command generators the plugin tests share.

use concord_session::{LastWill, SessionCommand, SessionFields, SessionPatch};
use rand::Rng;
use rand::rngs::StdRng;

fn random_fields(rng: &mut StdRng) -> SessionFields {
    SessionFields {
        session_expiry_interval_secs: *[0u32, 5, 60, u32::MAX].get(rng.random_range(0..4)).unwrap(),
        clean_start: rng.random(),
        last_will: rng.random_bool(0.5).then(|| LastWill {
            topic: format!("t/{}", rng.random_range(0..100)),
            payload: (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            // Now and then out of bounds, to exercise INVALID_FIELD.
            qos: rng.random_range(0..4),
            retain: rng.random(),
            delay_interval_secs: rng.random_range(0..10),
        }),
        broker_id: format!("broker-{}", rng.random_range(0..3)),
        connection_id: rng.random(),
    }
}

/// A random session command (about a tenth of them damaged bytes) at time `now_ms`.
pub fn random_session_command(rng: &mut StdRng, now_ms: u64) -> Vec<u8> {
    let client_id = format!(
        "{}{:02}",
        ["room/", "dev/", ""][rng.random_range(0..3)],
        rng.random_range(0..30)
    );
    let expected_version = rng.random_bool(0.3).then(|| rng.random_range(1..4));
    let command = match rng.random_range(0..100) {
        0..30 => SessionCommand::Create {
            client_id,
            fields: random_fields(rng),
            now_ms,
        },
        30..40 => SessionCommand::Get { client_id },
        40..50 => SessionCommand::Replace {
            client_id,
            fields: random_fields(rng),
            expected_version,
            now_ms,
        },
        50..65 => SessionCommand::Update {
            client_id,
            patch: SessionPatch {
                connection_id: rng.random_bool(0.5).then(|| rng.random()),
                clean_start: rng.random_bool(0.5).then(|| rng.random()),
                last_will: rng.random_bool(0.2).then_some(None),
                ..Default::default()
            },
            expected_version,
            now_ms,
        },
        65..75 => SessionCommand::Delete {
            client_id,
            expected_version,
        },
        75..85 => SessionCommand::List {
            prefix: ["room/", "dev/", ""][rng.random_range(0..3)].into(),
            start_after: rng.random_bool(0.3).then(|| "dev/10".into()),
            limit: rng.random_range(0..12),
        },
        85..90 => SessionCommand::Expire {
            now_ms,
            start_after: None,
            scan_limit: rng.random_range(1..50),
        },
        _ => {
            // Damaged bytes: a valid command cut short or flipped.
            let mut bytes = SessionCommand::Get { client_id }.encode();
            let cut = rng.random_range(0..bytes.len());
            bytes.truncate(cut);
            bytes.push(rng.random());
            return bytes;
        }
    };
    command.encode()
}
