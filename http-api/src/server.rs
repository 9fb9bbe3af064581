//! `concord serve`: the engine on its own threads, the HTTP API on threads of its own
//! (`http_threads.rs`), and a shutdown that stops accepting, drains in-flight requests, then
//! flushes.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use concord_engine::{ClusterConfig, Engine, EngineError};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::http_listener::{self, ListenerLimits, SLOW_STOP};
use crate::http_threads::HttpThreads;
use crate::session_expiry;
use crate::settings::SettingsError;
use crate::{AppState, AppStateFields, Settings, router};

/// Why the server could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The settings are invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(String),
    /// The engine could not open its data.
    #[error("cannot open the engine: {0}")]
    Engine(#[from] EngineError),
    /// The HTTP threads could not start.
    #[error("cannot start the HTTP threads: {0}")]
    Runtime(#[source] std::io::Error),
    /// The engine failed while serving (a storage failure, say); the server stopped so that
    /// a restart recovers from what is durable.
    #[error("the engine failed, and the server stopped: {0}")]
    EngineFailed(String),
    /// The server stopped, but the engine's last flush failed (a failing disk): what was
    /// written without a sync since the previous flush may be lost.
    #[error(transparent)]
    StopFailed(EngineError),
    /// The HTTP address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Histogram buckets in seconds: 50 µs to 10 s, for every histogram but the entry counts.
const LATENCY_BUCKETS_SECS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Histogram buckets in entries: 1 to 65,536, for every `concord_*_entries` metric (a round
/// of one group carries a few entries; a round of thousands of groups, thousands).
const ENTRY_COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0,
];

/// How often the HTTP runtimes' gauges are sampled.
const RUNTIME_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// How long the HTTP threads wait, once stopped, for their tasks that block.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the server until SIGTERM or Ctrl-C. Prints `concord listening on http://ADDR` (or
/// `https://` with TLS) on stdout once the socket is bound (the address is the real one when
/// the port was 0).
pub fn serve(settings: Settings) -> Result<(), ServeError> {
    settings.validate()?;
    let admin_token = settings.admin_token()?;
    let http_tls = settings.http_tls()?;
    if admin_token.is_none() && !settings.http_addr.ip().is_loopback() {
        tracing::warn!(
            http_addr = %settings.http_addr,
            "no admin token (--admin-token-file): anyone who reaches this address can change \
             the cluster's membership"
        );
    }
    let metrics = install_metrics()?;
    // Bound before the engine opens, so that the URL this member tells its peers carries the
    // real port when the port was 0.
    let http_addr = settings.http_addr;
    let listen_error = move |source| ServeError::Listen {
        address: http_addr,
        source,
    };
    let listener = http_listener::bind(settings.http_addr).map_err(listen_error)?;
    let address = listener.local_addr().map_err(listen_error)?;
    let scheme = if http_tls.is_some() { "https" } else { "http" };
    let mut engine_config = settings.engine_config()?;
    if let Some(cluster) = &mut engine_config.cluster
        && cluster.client_url.is_none()
    {
        cluster.client_url = Some(default_client_url(scheme, address, cluster));
    }
    // The engine's raft and apply threads are its own OS threads: nothing of it runs on the
    // HTTP threads, and HTTP handlers never run on raft's threads.
    let engine = Arc::new(Engine::open(engine_config)?);
    let threads = HttpThreads::start(settings.http_workers, RUNTIME_SHUTDOWN_TIMEOUT)
        .map_err(ServeError::Runtime)?;
    let upkeep_handle = metrics.clone();
    let state = AppState::from(AppStateFields {
        engine: engine.clone(),
        metrics: Some(metrics),
        started_at: Instant::now(),
        batch_max_operations: settings.batch_max_operations,
        request_timeout: settings.request_timeout(),
        request_stats: Arc::default(),
        request_durations: Arc::default(),
        admin_token,
        in_flight: Arc::new(Semaphore::new(settings.http_max_in_flight_operations)),
    });
    let app = router(state, settings.max_body_bytes);
    let limits = ListenerLimits {
        tls: http_tls,
        max_connections: http_listener::connections_that_fit(settings.http_max_connections),
        header_timeout: settings.http_header_timeout(),
        drain_timeout: settings.request_timeout(),
    };
    let handles = threads.handles().to_vec();
    let first = handles[0].clone();
    let expiry_scan_every = (settings.session_expiry_scan_ms > 0)
        .then(|| Duration::from_millis(settings.session_expiry_scan_ms));
    let data_dir = settings.data_dir.clone();
    let serving_engine = engine.clone();
    // The listener, the background tasks and the watch for a stop run on the first HTTP
    // thread; the connections, on every HTTP thread in turn.
    let served = first.block_on(first.spawn(async move {
        let engine = serving_engine;
        let listener = TcpListener::from_std(listener).map_err(listen_error)?;
        // Scripts read the address from this line. One that no longer reads (its end of the
        // pipe closed) does not stop the server: the log says where it listens too.
        {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "concord listening on {scheme}://{address}");
            let _ = stdout.flush();
        }
        tracing::info!(%address, data_dir = %data_dir.display(), "serving");
        tokio::spawn(sample_runtimes(handles.clone()));
        tokio::spawn(metrics_upkeep(upkeep_handle));
        if let Some(every) = expiry_scan_every {
            tokio::spawn(session_expiry::run_scans(engine.clone(), every));
        }
        let mut failed = None;
        let stop = async {
            tokio::select! {
                () = shutdown_signal() => {}
                reason = engine_failure(&engine) => {
                    tracing::error!(
                        %reason,
                        "the engine failed; stopping, so that a restart recovers from what is durable"
                    );
                    failed = Some(reason);
                }
            }
        };
        http_listener::serve(listener, &handles, app, limits, stop).await;
        match failed {
            Some(reason) => Err(ServeError::EngineFailed(reason)),
            None => Ok(()),
        }
    }));
    // In-flight requests are answered by now; stop the HTTP threads, then drain and flush the
    // engine, even if serving failed.
    let stopping_threads = Instant::now();
    threads.stop();
    let threads_took = stopping_threads.elapsed();
    if threads_took >= SLOW_STOP {
        tracing::warn!(
            took_ms = threads_took.as_millis() as u64,
            "the HTTP threads were slow to stop"
        );
    }
    let stopped = engine.shutdown();
    // The stores close with the last handle to the engine: this one, unless a task outlived
    // the HTTP threads. A store slow to let go (a database flushing on its way out) is the
    // last step of a stop, and says so like the others.
    let closing_stores = Instant::now();
    drop(engine);
    let stores_took = closing_stores.elapsed();
    if stores_took >= SLOW_STOP {
        tracing::warn!(
            took_ms = stores_took.as_millis() as u64,
            "the stores were slow to close"
        );
    }
    tracing::info!("stopped");
    let served = match served {
        Ok(served) => served,
        Err(error) => Err(ServeError::Runtime(std::io::Error::other(format!(
            "the HTTP listener's task ended without finishing: {error}"
        )))),
    };
    // Why serving ended comes first; a failed last flush is the exit's reason when serving
    // ended well, and is logged otherwise.
    match (served, stopped) {
        (Ok(()), stopped) => stopped.map_err(ServeError::StopFailed),
        (Err(serving), Err(stopping)) => {
            tracing::error!(error = %stopping, "stopping");
            Err(serving)
        }
        (Err(serving), Ok(())) => Err(serving),
    }
}

/// The scheme and the HTTP address bound; an address of all interfaces is replaced by the host
/// this member's peers reach it at.
fn default_client_url(scheme: &str, http: SocketAddr, cluster: &ClusterConfig) -> String {
    let mut reachable = http;
    if http.ip().is_unspecified()
        && let Some(raft) = cluster.members.get(&cluster.node_id)
    {
        reachable.set_ip(raft.ip());
    }
    format!("{scheme}://{reachable}")
}

fn install_metrics() -> Result<PrometheusHandle, ServeError> {
    PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS_SECS)
        .and_then(|builder| {
            builder.set_buckets_for_metric(Matcher::Suffix("_entries".into()), ENTRY_COUNT_BUCKETS)
        })
        .map_err(|e| ServeError::Metrics(e.to_string()))?
        .install_recorder()
        .map_err(|e| ServeError::Metrics(e.to_string()))
}

/// How often the histograms' recorded samples are folded into their buckets.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Folds the samples every histogram recorded into its buckets, now and then. The recorder
/// keeps each sample until then: without this, a node nobody scrapes (`/metrics` does the same
/// fold) grows by every sample of every request, for as long as it runs.
async fn metrics_upkeep(handle: PrometheusHandle) {
    let mut interval = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        handle.run_upkeep();
    }
}

/// Samples the HTTP threads' runtimes' gauges, summed (the raft runtime's are sampled by its
/// workers).
async fn sample_runtimes(handles: Vec<tokio::runtime::Handle>) {
    let alive = metrics::gauge!("concord_runtime_alive_tasks", "runtime" => "http");
    let queue = metrics::gauge!("concord_runtime_global_queue_depth", "runtime" => "http");
    let mut interval = tokio::time::interval(RUNTIME_SAMPLE_INTERVAL);
    loop {
        interval.tick().await;
        let (mut tasks, mut queued) = (0, 0);
        for handle in &handles {
            let runtime = handle.metrics();
            tasks += runtime.num_alive_tasks();
            queued += runtime.global_queue_depth();
        }
        alive.set(tasks as f64);
        queue.set(queued as f64);
    }
}

/// How often the server looks for a failure of the engine.
const FAILURE_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Resolves with the reason once the engine reports a failure.
async fn engine_failure(engine: &Engine) -> String {
    let mut interval = tokio::time::interval(FAILURE_CHECK_INTERVAL);
    loop {
        interval.tick().await;
        if let Some(reason) = engine.failure() {
            return reason;
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: draining"),
        () = terminate => tracing::info!("SIGTERM: draining"),
    }
}
