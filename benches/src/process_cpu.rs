//! CPU time and resident memory of a process, for "CPU per operation" and memory figures.
//!
//! On a shared machine, throughput moves with what the neighbours do; the CPU time a run
//! consumed per operation moves much less (the kernel charges time stolen by the hypervisor to
//! no task), so it is the steadier figure for comparing two builds.

use std::collections::BTreeMap;
use std::time::Duration;

/// The kernel's `USER_HZ`, the unit of `utime` and `stime` in `/proc/<pid>/stat`: fixed at 100
/// in Linux's user-space ABI.
const USER_HZ: u64 = 100;

/// User plus system CPU time of every thread of this process so far (10 ms resolution), or
/// `None` where `/proc/self/stat` cannot be read (not Linux).
pub fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_time_of_stat(&stat)
}

/// The same for process `pid` of this machine.
pub fn process_cpu_time_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_time_of_stat(&stat)
}

/// Resident memory of process `pid` of this machine (`VmRSS`), or `None` where
/// `/proc/<pid>/status` cannot be read.
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process of this machine that listens on TCP `port` (IPv4 or IPv6), found through the
/// kernel's socket tables and the processes' descriptors; `None` when there is none or its
/// descriptors cannot be read (another user's process).
pub fn pid_listening_on(port: u16) -> Option<u32> {
    /// `st` of a listening socket in `/proc/net/tcp`.
    const LISTEN: &str = "0A";
    let mut sockets = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // Fields: sl, local_address (hex ip:hex port), rem_address, st, ..., inode (10th).
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                sockets.push(format!("socket:[{inode}]"));
            }
        }
    }
    if sockets.is_empty() {
        return None;
    }
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(descriptors) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        for descriptor in descriptors.flatten() {
            if let Ok(target) = std::fs::read_link(descriptor.path())
                && sockets
                    .iter()
                    .any(|socket| target.as_os_str() == socket.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// A reading of one figure of every thread of a process: by thread id, the thread's name (its
/// `comm`, at most 15 bytes) and the figure so far (a time, or counts).
pub type ThreadReading<T = Duration> = BTreeMap<u64, (String, T)>;

/// A figure that only grows while a thread lives: what it added between two readings.
pub trait ThreadTally: Copy + Default + std::ops::AddAssign {
    /// `self` less the `earlier` reading (nothing if the figure went back).
    fn since(self, earlier: Self) -> Self;
}

impl ThreadTally for Duration {
    fn since(self, earlier: Self) -> Self {
        self.saturating_sub(earlier)
    }
}

/// Context switches of one thread so far: `(voluntary, involuntary)` — it blocked, or the
/// kernel took its core while it could still run (a yield counts here too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextSwitches {
    /// The thread blocked (parked, waited on a lock or on I/O).
    pub voluntary: u64,
    /// The thread could have run on.
    pub involuntary: u64,
}

impl std::ops::AddAssign for ContextSwitches {
    fn add_assign(&mut self, other: Self) {
        self.voluntary += other.voluntary;
        self.involuntary += other.involuntary;
    }
}

impl ThreadTally for ContextSwitches {
    fn since(self, earlier: Self) -> Self {
        ContextSwitches {
            voluntary: self.voluntary.saturating_sub(earlier.voluntary),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
        }
    }
}

/// Which figure of a thread to read.
#[derive(Clone, Copy)]
enum ThreadFigure {
    /// User plus system CPU time (`/proc/.../stat`, 10 ms resolution).
    Cpu,
    /// Time spent runnable but waiting for a core (`/proc/.../schedstat`, nanoseconds): what a
    /// thread lost to the others on a machine with fewer cores than busy threads.
    RunQueueWait,
}

/// CPU time so far of each thread of this process. Empty where `/proc/self/task` cannot be
/// read (not Linux).
pub fn thread_cpu_times() -> ThreadReading {
    read_threads(std::path::Path::new("/proc/self/task"), ThreadFigure::Cpu)
}

/// The same for process `pid` of this machine.
pub fn thread_cpu_times_of(pid: u32) -> ThreadReading {
    read_threads(
        std::path::Path::new(&format!("/proc/{pid}/task")),
        ThreadFigure::Cpu,
    )
}

/// The time each thread of this process has waited for a core so far. Empty where the kernel
/// keeps no scheduler statistics (`schedstat`) or `/proc` cannot be read.
pub fn thread_run_queue_waits() -> ThreadReading {
    read_threads(
        std::path::Path::new("/proc/self/task"),
        ThreadFigure::RunQueueWait,
    )
}

/// The same for process `pid` of this machine.
pub fn thread_run_queue_waits_of(pid: u32) -> ThreadReading {
    read_threads(
        std::path::Path::new(&format!("/proc/{pid}/task")),
        ThreadFigure::RunQueueWait,
    )
}

/// The context switches of each thread of this process so far. Empty where `/proc` cannot be
/// read.
pub fn thread_context_switches() -> ThreadReading<ContextSwitches> {
    read_context_switches(std::path::Path::new("/proc/self/task"))
}

/// The same for process `pid` of this machine.
pub fn thread_context_switches_of(pid: u32) -> ThreadReading<ContextSwitches> {
    read_context_switches(std::path::Path::new(&format!("/proc/{pid}/task")))
}

fn read_context_switches(task_dir: &std::path::Path) -> ThreadReading<ContextSwitches> {
    read_each_thread(task_dir, |task, _| {
        let status = std::fs::read_to_string(task.join("status")).ok()?;
        context_switches_of_status(&status)
    })
}

fn read_threads(task_dir: &std::path::Path, figure: ThreadFigure) -> ThreadReading {
    read_each_thread(task_dir, |task, stat| match figure {
        ThreadFigure::Cpu => cpu_time_of_stat(stat),
        ThreadFigure::RunQueueWait => std::fs::read_to_string(task.join("schedstat"))
            .ok()
            .and_then(|schedstat| run_queue_wait_of_schedstat(&schedstat)),
    })
}

/// `read(task directory, its stat line)` for every thread in `task_dir`, with the thread's
/// name; a thread whose figure cannot be read is left out.
fn read_each_thread<T>(
    task_dir: &std::path::Path,
    read: impl Fn(&std::path::Path, &str) -> Option<T>,
) -> ThreadReading<T> {
    let mut threads = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(task_dir) else {
        return threads;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|name| name.parse().ok()) else {
            continue;
        };
        // A thread that ended meanwhile has no files left: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(name), Some(value)) = (name_of_stat(&stat), read(&task.path(), &stat)) {
            threads.insert(tid, (name.to_string(), value));
        }
    }
    threads
}

/// How much of a figure each kind of thread added between two readings. A kind is a thread's
/// name without the numbers that tell threads of one kind apart (`concord-raft-1-0` and
/// `concord-raft-2-0` are both `concord-raft`). A thread that ended between the readings is
/// not counted.
pub fn by_thread_kind<T: ThreadTally>(
    before: &ThreadReading<T>,
    after: &ThreadReading<T>,
) -> BTreeMap<String, T> {
    let mut kinds: BTreeMap<String, T> = BTreeMap::new();
    for (tid, (name, value)) in after {
        let earlier = before.get(tid).map_or_else(T::default, |(_, value)| *value);
        *kinds.entry(thread_kind(name).to_string()).or_default() += value.since(earlier);
    }
    kinds
}

/// Context switches of each kind of thread per thousand operations, as `[voluntary,
/// involuntary]` (empty when there were no operations).
pub fn switches_per_1k_operations(
    by_kind: BTreeMap<String, ContextSwitches>,
    ops: u64,
) -> BTreeMap<String, [f64; 2]> {
    if ops == 0 {
        return BTreeMap::new();
    }
    let per_1k = |count: u64| count as f64 * 1000.0 / ops as f64;
    by_kind
        .into_iter()
        .map(|(kind, switches)| {
            (
                kind,
                [per_1k(switches.voluntary), per_1k(switches.involuntary)],
            )
        })
        .collect()
}

/// `by_kind` per second of `seconds`, in ms (empty when no time passed).
pub fn ms_per_second(by_kind: BTreeMap<String, Duration>, seconds: f64) -> BTreeMap<String, f64> {
    if seconds <= 0.0 {
        return BTreeMap::new();
    }
    by_kind
        .into_iter()
        .map(|(kind, time)| (kind, time.as_secs_f64() * 1e3 / seconds))
        .collect()
}

/// `cpu_by_kind` per operation, in µs (empty when there were no operations).
pub fn us_per_operation(
    cpu_by_kind: BTreeMap<String, Duration>,
    ops: u64,
) -> BTreeMap<String, f64> {
    if ops == 0 {
        return BTreeMap::new();
    }
    cpu_by_kind
        .into_iter()
        .map(|(kind, cpu)| (kind, cpu.as_secs_f64() * 1e6 / ops as f64))
        .collect()
}

/// `kind µs, kind µs, ...` for a table's note line.
pub fn by_thread_text(us_per_op: &BTreeMap<String, f64>, decimals: usize) -> String {
    let parts: Vec<String> = us_per_op
        .iter()
        .map(|(kind, us)| format!("{kind} {us:.decimals$}"))
        .collect();
    parts.join(", ")
}

/// `kind voluntary + involuntary, ...` for a table's note line.
pub fn switches_text(per_1k_ops: &BTreeMap<String, [f64; 2]>) -> String {
    let parts: Vec<String> = per_1k_ops
        .iter()
        .map(|(kind, [voluntary, involuntary])| format!("{kind} {voluntary:.1} + {involuntary:.1}"))
        .collect();
    parts.join(", ")
}

/// `name` without its trailing numbers and dashes.
fn thread_kind(name: &str) -> &str {
    let kind = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
    if kind.is_empty() { name } else { kind }
}

/// The command name of a `/proc/.../stat` line: between the first `(` and the last `)`.
fn name_of_stat(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a `/proc/.../status` text.
fn context_switches_of_status(status: &str) -> Option<ContextSwitches> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(name))?;
        line[name.len()..].trim().parse().ok()
    };
    Some(ContextSwitches {
        voluntary: field("voluntary_ctxt_switches:")?,
        involuntary: field("nonvoluntary_ctxt_switches:")?,
    })
}

/// The second field of a `/proc/.../schedstat` line (`run_ns wait_ns timeslices`): the time
/// the thread has waited on a run queue.
fn run_queue_wait_of_schedstat(schedstat: &str) -> Option<Duration> {
    let wait_ns: u64 = schedstat.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(wait_ns))
}

/// The machine's CPU time so far, every core and process together: `(busy, idle)` in the
/// kernel's ticks, from `/proc/stat` (idle counts I/O wait; time the hypervisor stole counts
/// busy). `None` where it cannot be read.
pub fn machine_cpu_ticks() -> Option<(u64, u64)> {
    machine_ticks_of_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The share of the machine's cores left idle between two readings of
/// [`machine_cpu_ticks`], in percent.
pub fn idle_percent(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let busy = after.0.checked_sub(before.0)?;
    let idle = after.1.checked_sub(before.1)?;
    let total = busy + idle;
    (total > 0).then(|| idle as f64 * 100.0 / total as f64)
}

/// `(busy, idle)` of `/proc/stat`'s first line: `cpu user nice system idle iowait irq softirq
/// steal guest guest_nice` (guest time is inside user and nice already).
fn machine_ticks_of_stat(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut fields = line.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
        return None;
    };
    Some((user + nice + system + irq + softirq + steal, idle + iowait))
}

/// Parses `utime` and `stime` (fields 14 and 15) out of a `/proc/<pid>/stat` line. The second
/// field, the command name in parentheses, may itself hold spaces and parentheses: fields are
/// counted after its last `)`.
fn cpu_time_of_stat(stat: &str) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_ascii_whitespace();
    // After the name come field 3 (state) onwards: utime is field 14, the 12th of these.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1000 / USER_HZ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utime_and_stime_after_a_name_with_spaces() {
        let stat = "4242 (concord bench (x)) R 1 4242 4242 0 -1 4194560 500 0 0 0 250 30 0 0 \
                    20 0 9 0 100 1000 200 18446744073709551615";
        assert_eq!(cpu_time_of_stat(stat), Some(Duration::from_millis(2800)));
        assert_eq!(cpu_time_of_stat("4242 (short) R 1"), None);
        assert_eq!(name_of_stat(stat), Some("concord bench (x)"));
    }

    #[test]
    fn threads_of_one_kind_add_up_and_ended_threads_drop_out() {
        let ms = Duration::from_millis;
        let reading = |threads: &[(u64, &str, u64)]| {
            threads
                .iter()
                .map(|&(tid, name, cpu)| (tid, (name.to_string(), ms(cpu))))
                .collect::<BTreeMap<_, _>>()
        };
        let before = reading(&[
            (1, "concord-bench", 100),
            (2, "concord-raft-1-", 50),
            (3, "gone", 7),
        ]);
        let after = reading(&[
            (1, "concord-bench", 110),
            (2, "concord-raft-1-", 80),
            (4, "concord-raft-2-", 20),
            (5, "tokio-rt-worker", 40),
        ]);
        let kinds = by_thread_kind(&before, &after);
        assert_eq!(kinds["concord-bench"], ms(10));
        assert_eq!(kinds["concord-raft"], ms(50));
        assert_eq!(kinds["tokio-rt-worker"], ms(40));
        assert!(!kinds.contains_key("gone"));
        assert_eq!(thread_kind("1234"), "1234");
        let per_op = us_per_operation(kinds, 10);
        assert_eq!(per_op["concord-raft"], 5000.0);
        assert_eq!(
            by_thread_text(&per_op, 1),
            "concord-bench 1000.0, concord-raft 5000.0, tokio-rt-worker 4000.0"
        );
        assert!(us_per_operation(BTreeMap::from([("x".into(), ms(1))]), 0).is_empty());
        let per_second = ms_per_second(BTreeMap::from([("concord-raft".into(), ms(500))]), 2.0);
        assert_eq!(per_second["concord-raft"], 250.0);
        assert!(ms_per_second(BTreeMap::from([("x".into(), ms(1))]), 0.0).is_empty());
    }

    #[test]
    fn reads_the_machines_busy_and_idle_ticks() {
        let stat = "cpu  100 5 20 300 10 1 2 3 7 0\ncpu0 50 2 10 150 5 0 1 1 0 0\n";
        assert_eq!(machine_ticks_of_stat(stat), Some((131, 310)));
        assert_eq!(machine_ticks_of_stat("cpu 1 2 3\n"), None);
        assert_eq!(machine_ticks_of_stat("intr 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(idle_percent((100, 100), (175, 125)), Some(25.0));
        assert_eq!(idle_percent((100, 100), (100, 100)), None);
        assert_eq!(idle_percent((100, 100), (90, 120)), None);
    }

    #[test]
    fn reads_and_counts_context_switches_per_thousand_operations() {
        let status = "Name:\tconcord-raft-1-\nvoluntary_ctxt_switches:\t120\n\
                      nonvoluntary_ctxt_switches:\t7\n";
        let switches = |voluntary, involuntary| ContextSwitches {
            voluntary,
            involuntary,
        };
        assert_eq!(context_switches_of_status(status), Some(switches(120, 7)));
        assert_eq!(context_switches_of_status("Name:\tx\n"), None);
        let before = BTreeMap::from([(2, ("concord-raft-1-".to_string(), switches(100, 5)))]);
        let after = BTreeMap::from([
            (2, ("concord-raft-1-".to_string(), switches(120, 7))),
            (3, ("concord-raft-2-".to_string(), switches(30, 1))),
        ]);
        let kinds = by_thread_kind(&before, &after);
        assert_eq!(kinds["concord-raft"], switches(50, 3));
        let per_1k = switches_per_1k_operations(kinds, 500);
        assert_eq!(per_1k["concord-raft"], [100.0, 6.0]);
        assert!(switches_per_1k_operations(BTreeMap::new(), 0).is_empty());
        assert!(
            !thread_context_switches().is_empty(),
            "this test's own threads"
        );
    }

    #[test]
    fn reads_the_run_queue_wait_of_a_schedstat_line() {
        assert_eq!(
            run_queue_wait_of_schedstat("52000000 3400000 917\n"),
            Some(Duration::from_micros(3400))
        );
        assert_eq!(run_queue_wait_of_schedstat("52000000"), None);
        assert_eq!(run_queue_wait_of_schedstat("52000000 x 917"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn every_threads_run_queue_wait_is_read_by_name() {
        // Kernels built without scheduler statistics have no `schedstat`: nothing to read.
        if !std::path::Path::new("/proc/self/schedstat").exists() {
            return;
        }
        let reading = std::thread::Builder::new()
            .name("core-waiter-7".into())
            .spawn(thread_run_queue_waits)
            .unwrap()
            .join()
            .unwrap();
        assert!(
            reading.values().any(|(name, _)| name == "core-waiter-7"),
            "the reading thread is missing from {reading:?}"
        );
        assert!(by_thread_kind(&BTreeMap::new(), &reading).contains_key("core-waiter"));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_counter_moves_while_this_thread_computes() {
        let before = process_cpu_time().expect("/proc/self/stat is readable on Linux");
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        // Compute until the process has used 30 ms more, or give up after 10 s of wall time
        // (a counter that never moves is the failure this test is for).
        while process_cpu_time().unwrap() < before + Duration::from_millis(30) {
            assert!(
                std::time::Instant::now() < give_up,
                "CPU time did not advance"
            );
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn finds_the_process_listening_on_a_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(pid_listening_on(port), Some(std::process::id()));
        drop(listener);
        assert_eq!(pid_listening_on(port), None);
    }
}
