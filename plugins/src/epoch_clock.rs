//! The watchdog's clock: a thread that advances the wasmtime engine's epoch every tick, so
//! that a plugin call running past its deadline (counted in ticks) is interrupted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::Engine;

/// How often the watchdog clock ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped: the watchdog's clock.
pub(crate) struct EpochClock {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochClock {
    pub(crate) fn start(engine: Engine) -> std::io::Result<EpochClock> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("concord-plugin-clock".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochClock {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochClock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
