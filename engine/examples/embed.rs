//! Embeds Concord (`cargo run -p concord-engine --example embed -- [DATA_DIR]`; run it twice).
use concord_engine::{Consistency, Engine, EngineConfig, SessionFields, SessionPatch};
use concord_engine::{is_session_error, session_code::NOT_FOUND};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data_dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "data/embed".into());
    let engine = Engine::open(EngineConfig::new(&data_dir))?; // redb, raft, session plugin
    let sessions = engine.sessions()?;
    let session = match sessions.get("dev/1", Consistency::Linearizable).await {
        Err(e) if is_session_error(&e, NOT_FOUND) => {
            sessions.create("dev/1", SessionFields::default()).await?
        }
        found => found?,
    };
    let patch = SessionPatch {
        connection_id: Some(session.fields.connection_id + 1),
        ..Default::default()
    };
    let updated = sessions
        .update("dev/1", patch, Some(session.version))
        .await?;
    let (version, connection) = (updated.version, updated.fields.connection_id);
    println!("dev/1 is at version {version}, connection {connection}");
    engine.shutdown()?; // answers what is queued, flushes the stores
    Ok(())
}
