//! The `concord` server: an axum HTTP API for MQTT-style session CRUD over the Concord engine.
//!
//! # Layout
//!
//! - `main.rs`: the `concord` binary (`concord serve`); `server.rs`: runtimes, signals, the
//!   drain-then-flush shutdown; `http_listener.rs`: connections, their limit and deadlines; `http_tls.rs`: its optional TLS.
//! - `settings.rs`: every setting declared once; defaults < TOML file < environment < flags.
//! - `router.rs`: routes, shared state, the timeout and latency layer; `request_gate.rs`:
//!   what a request is refused for before its handler runs; `batch_places.rs`: the places a
//!   batch takes before its body is read.
//! - `routes_sessions.rs`, `routes_batch.rs`, `routes_plugins.rs`, `routes_ops.rs`,
//!   `routes_cluster.rs`, `routes_backup.rs`: the handlers; `group_json.rs`: one group as `/v1/status` and
//!   `/v1/cluster/groups/{group}` show it.
//! - `plugin_command.rs`: `concord plugin new|upgrade`; `plugin_template.rs`: the project
//!   `plugin new` writes, which builds on its own; `member_command.rs`: `concord member ...`;
//!   `group_command.rs`: `concord group show|transfer`; `backup_command.rs`: `concord backup`
//!   and `concord restore`; `admin_client.rs`: the HTTP client they call a node with.
//! - `admin_token.rs`: the bearer token the routes that change the cluster (or read all of
//!   it, as a backup) require.
//! - `forwarding.rs`: the `Concord-Forward` header (421 from a member that does not lead,
//!   when the client asks not to be forwarded).
//! - `session_json.rs`: request and answer shapes; `json_body.rs`: the JSON extractor;
//!   `problem.rs`: every error as `application/problem+json` with a stable `type`.
//! - `session_expiry.rs`: the scans that remove expired sessions of the groups this node leads.
//! - `request_stats.rs` and `status_page.html`: the status page at `/`; `request_durations.rs`:
//!   every route's latency histograms in `/metrics`.
//! - `openapi.rs`: `/openapi.json` generated from the handlers' annotations; `docs_page.html`
//!   renders it at `/docs`; `openapi_shared.rs`: the answers and headers several routes'
//!   annotations share.

mod admin_client;
mod admin_token;
pub mod backup_command;
mod batch_places;
mod forwarding;
pub mod group_command;
mod group_json;
mod http_listener;
mod http_threads;
mod http_tls;
mod json_body;
pub mod member_command;
mod no_query;
mod openapi;
mod openapi_shared;
mod panic_log;
pub mod plugin_command;
mod plugin_template;
mod problem;
mod request_deadlines;
mod request_durations;
mod request_gate;
mod request_layer;
mod request_stats;
mod router;
mod routes_backup;
mod routes_batch;
mod routes_cluster;
mod routes_ops;
mod routes_plugins;
mod routes_sessions;
mod server;
mod session_expiry;
mod session_json;
mod settings;
mod status_groups;
#[cfg(test)]
mod test_engine;
mod thread_shard;

pub use admin_token::AdminToken;
pub use panic_log::log_panics;
pub use router::{AppState, AppStateFields, router};
pub use server::{ServeError, serve};
pub use settings::{Settings, SettingsError};
