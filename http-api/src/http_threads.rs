//! The HTTP threads: each runs a tokio runtime of its own (current-thread), and the listener
//! deals the accepted connections to them in turn, so a connection lives on one thread.
//!
//! Why not one work-stealing runtime for all of them: under a load of many connections, its
//! two queues — the tasks a thread's own sockets woke, held in a bounded local queue that spills
//! its oldest half into the shared one, and the tasks woken from other threads, which is how
//! every engine answer arrives — were served in an order that spread the wait of a request
//! over 0 to 2.5 times the mean. Here each thread has one unbounded first-come-first-served
//! queue for its sockets' tasks, and takes the tasks woken from other threads (the answers)
//! before it: a request the engine has answered is finished, and its connection freed for the
//! next request, before more requests are read in. Stealing is given up: requests are small
//! and alike, and connections are dealt evenly.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How far ahead lies the timer each HTTP thread's runtime always has pending: sooner than
/// the timers its connections set (hyper's timeout for a request's head,
/// `http_header_timeout_ms`, 30 s by default; a head timeout under this period brings back the
/// wakes `keep_a_timer_pending` saves, and changes nothing else).
const PENDING_TIMER_PERIOD: Duration = Duration::from_secs(1);

/// Keeps a timer pending on this thread's runtime, for ever.
///
/// Setting a tokio timer wakes its runtime's driver (a write to the runtime's eventfd) if the
/// timer expires sooner than every timer the driver held when it last polled, which is always
/// the case when it held none. hyper sets a timer for each request's head and drops it
/// once the head has arrived, most often within the same poll: on a thread with no timer of its
/// own, that was a system call for about every third request it served. Once this timer,
/// sooner than any head's, is pending, setting theirs wakes nothing.
async fn keep_a_timer_pending() {
    loop {
        tokio::time::sleep(PENDING_TIMER_PERIOD).await;
    }
}

/// The HTTP threads, running until [`HttpThreads::stop`].
pub(crate) struct HttpThreads {
    handles: Vec<Handle>,
    threads: Vec<(JoinHandle<()>, oneshot::Sender<()>)>,
}

impl HttpThreads {
    /// Starts `count` threads (at least one), named `concord-http-<n>`.
    pub(crate) fn start(count: usize, shutdown_timeout: Duration) -> std::io::Result<HttpThreads> {
        let count = count.max(1);
        let mut started = HttpThreads {
            handles: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for number in 0..count {
            let (handle_sender, handle_receiver) = mpsc::sync_channel(1);
            let (stop_sender, stop_receiver) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("concord-http-{number}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        // Tasks woken from other threads first (see the module's doc).
                        .global_queue_interval(1)
                        .enable_all()
                        .build();
                    let runtime = match runtime {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            let _ = handle_sender.send(Err(error));
                            return;
                        }
                    };
                    let _ = handle_sender.send(Ok(runtime.handle().clone()));
                    // Stopped, or the `HttpThreads` dropped: either way, stop.
                    runtime.block_on(async {
                        tokio::select! {
                            _ = stop_receiver => {}
                            () = keep_a_timer_pending() => {}
                        }
                    });
                    runtime.shutdown_timeout(shutdown_timeout);
                })?;
            let handle = handle_receiver.recv().map_err(|_| {
                std::io::Error::other("an HTTP thread ended before its runtime started")
            })??;
            started.handles.push(handle);
            started.threads.push((thread, stop_sender));
        }
        Ok(started)
    }

    /// The threads' runtimes, to spawn on.
    pub(crate) fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// Stops every thread: the tasks still on them are dropped once `shutdown_timeout` (given
    /// to [`HttpThreads::start`]) has passed for tasks that block. Returns once all ended.
    pub(crate) fn stop(self) {
        for (thread, stop) in self.threads {
            let _ = stop.send(());
            if thread.join().is_err() {
                tracing::error!("an HTTP thread panicked");
            }
        }
    }
}

/// Hands connections to the HTTP threads in turn.
pub(crate) struct Dealer<'a> {
    handles: &'a [Handle],
    next: usize,
}

impl<'a> Dealer<'a> {
    /// Deals to `handles`, which must not be empty.
    pub(crate) fn new(handles: &'a [Handle]) -> Dealer<'a> {
        assert!(!handles.is_empty(), "no HTTP thread to deal connections to");
        Dealer { handles, next: 0 }
    }

    /// The runtime the next connection goes to.
    pub(crate) fn next_handle(&mut self) -> &'a Handle {
        let handle = &self.handles[self.next];
        self.next = (self.next + 1) % self.handles.len();
        handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_tasks_and_stops() {
        let threads = HttpThreads::start(3, Duration::from_secs(1)).unwrap();
        assert_eq!(threads.handles().len(), 3);
        let mut dealer = Dealer::new(threads.handles());
        let names: Vec<String> = (0..6)
            .map(|_| {
                let (sender, receiver) = mpsc::channel();
                dealer.next_handle().spawn(async move {
                    let name = std::thread::current().name().unwrap_or("").to_string();
                    sender.send(name).unwrap();
                });
                receiver.recv_timeout(Duration::from_secs(10)).unwrap()
            })
            .collect();
        assert_eq!(
            names,
            [
                "concord-http-0",
                "concord-http-1",
                "concord-http-2",
                "concord-http-0",
                "concord-http-1",
                "concord-http-2"
            ]
        );
        threads.stop();
    }

    #[test]
    fn zero_threads_means_one() {
        let threads = HttpThreads::start(0, Duration::from_secs(1)).unwrap();
        assert_eq!(threads.handles().len(), 1);
        threads.stop();
    }
}
