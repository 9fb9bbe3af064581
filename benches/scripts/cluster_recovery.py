#!/usr/bin/env python3
"""Three `concord` processes on loopback: how long a member's loss costs.

  failover  SIGKILL the member leading the most groups under write load: time until every
            group has a live leader again (as a survivor reports), and the longest single
            write the load saw around the kill.
  restart   (with `--restart`) SIGKILL the member leading the most groups under write load
            and start it again at once on its data: time until every group has a live leader
            again (not the killed run), and the longest single write around the kill.
  snapshot  SIGKILL a member, wipe its data directory, start it again: time until every
            group on it has applied what its leader had, and the peak RSS of the member
            that came back (its state arrived as snapshots) and of the others, the CPU of
            each side, and how many states the member installed in how long (more than one
            per group is flagged: a state fetched again is work done twice). With
            `--writers-during-snapshot N`, N threads create sessions through the two others
            from 3 s before the kill until the member has caught up: their rate before the
            kill, and from the moment the groups the member led have new leaders (no create
            waits for an election then) until it has caught up, with the longest create in
            that time. After every catch-up each group's digest is compared on all three.

Usage (release build first: cargo build --release -p concord-http):
  python3 benches/scripts/cluster_recovery.py --sessions 1000000 --runs 5

Prints a line per run and a JSON line per run ({"case": "failover"|"restart"|"snapshot", ...}).
"""

import argparse
import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


# How long the writers run with all three members up before the wipe.
BASELINE_SECS = 2.0

# A 128-byte last will: a session of about 300 bytes in the state.
WILL_PAYLOAD = base64.b64encode(b"offline " * 16).decode()


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def three_members(binary, root, groups, server_args=()):
    """Three members of one cluster on free loopback raft ports, each with its data directory
    under `root`; not started."""
    ports = free_ports(3)
    flag = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    return [Member(binary, i + 1, flag, os.path.join(root, str(i + 1)), groups, server_args)
            for i in range(3)]


class Member:
    def __init__(self, binary, node, members, data_dir, groups, server_args=()):
        self.binary, self.node, self.members = binary, node, members
        self.data_dir, self.groups = data_dir, groups
        self.server_args = list(server_args)
        self.process, self.address = None, None
        self.stderr = sys.stderr  # where the process's log goes
        self.env = None  # the process's environment: this one's when None

    def start(self, state="new"):
        self.process = subprocess.Popen(
            [self.binary, "serve", "--data-dir", self.data_dir, "--http-addr", "127.0.0.1:0",
             "--log-level", "warn", "--groups", str(self.groups),
             "--initial-cluster", self.members, "--node-id", str(self.node),
             "--initial-cluster-state", state, *self.server_args],
            stdout=subprocess.PIPE, stderr=self.stderr, env=self.env, text=True)

    def wait_listening(self):
        line = self.process.stdout.readline().strip()
        self.address = line.rsplit("http://", 1)[1]

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)

    def peak_rss_bytes(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def cpu_secs(self):
        return stat_cpu_secs(f"/proc/{self.process.pid}/stat")

    def cpu_secs_by_thread(self):
        """CPU seconds of the process's live threads, summed by kind: the thread's name
        without its trailing number (`concord-raft-1-0` and `concord-raft-2-0` are
        `concord-raft`)."""
        by_kind = {}
        task_dir = f"/proc/{self.process.pid}/task"
        for task in os.listdir(task_dir):
            try:
                with open(f"{task_dir}/{task}/comm") as comm:
                    name = comm.read().strip()
                secs = stat_cpu_secs(f"{task_dir}/{task}/stat")
            except OSError:
                continue  # The thread ended meanwhile.
            kind = re.sub(r"[-_]?\d.*$", "", name)
            by_kind[kind] = by_kind.get(kind, 0.0) + secs
        return by_kind


def stat_cpu_secs(path):
    """User plus system CPU seconds of a `/proc/.../stat` file (fields 14 and 15, counted
    after the name's closing parenthesis)."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def call(address, method, path, body=None, timeout=30):
    """(status, body as text) of one request; a body given is sent as JSON."""
    content_type = "application/json" if body is not None else None
    code, answer = call_raw(address, method, path, body, content_type, timeout)
    return code, answer.decode()


def call_raw(address, method, path, body=None, content_type=None, timeout=30):
    """(status, body as bytes) of one request with `body` sent as `content_type`."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"content-type": content_type} if content_type else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def status(address):
    code, body = call(address, "GET", "/v1/status")
    return json.loads(body) if code == 200 else None


def installs(member):
    """(snapshots installed, seconds the install thread spent on them) since `member` started,
    from its /metrics."""
    _, text = call(member.address, "GET", "/metrics")
    figures = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in ('concord_snapshot_installs_total{outcome="installed"}',
                    "concord_snapshot_install_duration_seconds_sum"):
            figures[name.split("{")[0]] = float(value)
    return (int(figures.get("concord_snapshot_installs_total", 0)),
            figures.get("concord_snapshot_install_duration_seconds_sum", 0.0))


def fetches(member):
    """Per outcome (fetched, refused, failed): (snapshot fetches, their seconds in all) since
    `member` started, from its /metrics."""
    _, text = call(member.address, "GET", "/metrics")
    found = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        for kind in ("count", "sum"):
            prefix = f'concord_snapshot_fetch_duration_seconds_{kind}{{outcome="'
            if name.startswith(prefix):
                outcome = name[len(prefix):].split('"')[0]
                found.setdefault(outcome, {})[kind] = float(value)
    return {outcome: (int(f.get("count", 0)), f.get("sum", 0.0)) for outcome, f in found.items()}


def stale_statuses(member, client_ids):
    """Each id's status on `member`'s own state, read 1000 at a time."""
    statuses = {}
    for start in range(0, len(client_ids), 1000):
        chunk = client_ids[start:start + 1000]
        body = json.dumps({"operations": [{"op": "get", "client_id": c, "consistency": "stale"}
                                          for c in chunk]})
        code, answer = call(member.address, "POST", "/v1/sessions/batch", body)
        results = json.loads(answer)["results"] if code == 200 else [{"status": code}] * len(chunk)
        statuses.update(zip(chunk, (r["status"] for r in results)))
    return statuses


def group_digest(address, group):
    """(applied index, sha256) of `group`'s state on the member at `address`; the sha256 is
    `HTTP <code>` if it did not answer 200."""
    code, body = call(address, "GET", f"/v1/cluster/groups/{group}/digest")
    if code != 200:
        return None, f"HTTP {code}"
    digest = json.loads(body)
    return digest["applied_index"], digest["sha256"]


def start_all(members):
    """Starts every member, then waits until each listens and all are ready."""
    for m in members:
        m.start()
    for m in members:
        m.wait_listening()
    wait_ready(members)


def member_ready(member, timeout=120):
    """`True` once `member` answers /readyz with 200; `False` at the deadline, or as soon as
    its process has exited (it will never be ready)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if member.process is not None and member.process.poll() is not None:
            return False
        try:
            if call(member.address, "GET", "/readyz", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def wait_ready(members, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(call(m.address, "GET", "/readyz")[0] == 200 for m in members):
            return
        time.sleep(0.05)
    raise SystemExit("the cluster never became ready")


def load(members, sessions, threads=4, batch=1000):
    counter = iter(range(0, sessions, batch))
    lock = threading.Lock()

    def worker(index):
        member = members[index % len(members)]
        while True:
            with lock:
                start = next(counter, None)
            if start is None:
                return
            operations = [
                {"op": "create", "client_id": f"device/{n:08}",
                 "session": {"broker_id": "broker-1", "connection_id": n,
                             "session_expiry_interval_secs": 3600,
                             "last_will": {"topic": f"status/device/{n:08}",
                                           "payload_base64": WILL_PAYLOAD, "qos": 1}}}
                for n in range(start, min(start + batch, sessions))
            ]
            body = json.dumps({"operations": operations})
            while True:
                code, answer = call(member.address, "POST", "/v1/sessions/batch", body, 120)
                if code == 200:
                    break
                time.sleep(0.2)
            refused = [r for r in json.loads(answer)["results"] if r["status"] not in (201, 409)]
            if refused:
                raise SystemExit(f"a create was refused: {refused[0]}")

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


class Writers:
    """Threads creating sessions (each id once) through `through` by turns, until stopped:
    of the creates sent since the clock last started, how many were answered 201, and the
    longest."""

    def __init__(self, through, count, prefix):
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.created, self.longest = 0, 0.0
        self.clock_started = time.time()
        self.threads = [threading.Thread(target=self.write, args=(through[i % len(through)],
                                                                 f"{prefix}/{i}"))
                        for i in range(count)]
        for thread in self.threads:
            thread.start()

    def write(self, member, prefix):
        n = 0
        while not self.stop_event.is_set():
            n += 1
            body = json.dumps({"client_id": f"{prefix}/{n}", "broker_id": "b"})
            started = time.time()
            try:
                code, _ = call(member.address, "POST", "/v1/sessions", body, 30)
            except OSError:
                code = None
            took = time.time() - started
            with self.lock:
                # A create sent before the clock started belongs to the time before.
                if started >= self.clock_started:
                    self.longest = max(self.longest, took)
                    self.created += code == 201

    def restart_clock(self):
        """Returns (creates answered 201, longest create in secs) of those sent since the
        clock last started, and starts it again: from now on only creates sent from now
        count."""
        with self.lock:
            figures = (self.created, self.longest)
            self.created, self.longest = 0, 0.0
            self.clock_started = time.time()
        return figures

    def stop(self):
        """Stops every writer; returns (creates answered 201, longest create in secs)."""
        self.stop_event.set()
        for thread in self.threads:
            thread.join()
        return self.created, self.longest


def failover(members, victim_index, run):
    """Kills members[victim_index] under load; returns (leaders back, longest write) secs."""
    survivors = [m for i, m in enumerate(members) if i != victim_index]
    victim = members[victim_index]
    writers = Writers(survivors, 8, f"failover/{run}")
    time.sleep(1.0)
    writers.restart_clock()
    victim.kill()
    killed_at = time.time()
    back = None
    while time.time() - killed_at < 30:
        if leaders_live(survivors, victim.node):
            back = time.time() - killed_at
            break
        time.sleep(0.01)
    time.sleep(1.0)
    _, longest = writers.stop()
    return back, longest


def restart_at_once(members, victim_index, run):
    """Kills members[victim_index] under load and starts it again at once on its data;
    returns (leaders back, longest write) secs, leaders back meaning that the survivors name
    a leader for every group, none of them the killed run."""
    survivors = [m for i, m in enumerate(members) if i != victim_index]
    victim = members[victim_index]
    terms_at_kill = group_terms(members)
    writers = Writers(survivors, 8, f"restart/{run}")
    time.sleep(1.0)
    writers.restart_clock()
    victim.kill()
    killed_at = time.time()
    victim.start()
    back = None
    while time.time() - killed_at < 30:
        if leaders_live(survivors, victim.node, terms_at_kill):
            back = time.time() - killed_at
            break
        time.sleep(0.01)
    victim.wait_listening()
    time.sleep(1.0)
    _, longest = writers.stop()
    return back, longest


def group_terms(members):
    """Each group's highest term among `members`."""
    terms = {}
    for member in members:
        for group in (status(member.address) or {"groups": []})["groups"]:
            terms[group["group"]] = max(terms.get(group["group"], 0), group["term"])
    return terms


def leaders_live(members, dead_node, terms_at_kill=None):
    """Every member names a leader for every group, and none names `dead_node` — unless the
    leader is `dead_node` come back, elected in a term later than `terms_at_kill` (a member
    brought back may be handed a group it caught up on before the last election is over)."""
    def live(group):
        if group["leader"] == 0:
            return False
        if group["leader"] != dead_node:
            return True
        return terms_at_kill is not None and group["term"] > terms_at_kill.get(group["group"], 0)

    views = [status(m.address) for m in members]
    return all(v and all(live(g) for g in v["groups"]) for v in views)


def caught_up(member, others):
    """Every group on `member` has applied as far as on every other member. The others are
    asked first: under writes, `member` must reach where they were a moment before."""
    targets = {}
    for other in others:
        for group in status(other.address)["groups"]:
            targets[group["group"]] = max(targets.get(group["group"], 0), group["applied_index"])
    mine = status(member.address)
    if not mine:
        return False
    return all(g["applied_index"] >= targets[g["group"]] for g in mine["groups"])


def check_digests(members, groups, timeout=60):
    """Waits until each group has applied the same index on every member, then checks that
    its state's digest is the same everywhere; exits with the groups that differ."""
    deadline = time.time() + timeout
    while True:
        differing = []
        for group in range(groups):
            digests = {group_digest(m.address, group) for m in members}
            if len(digests) != 1:
                differing.append((group, sorted(digests, key=str)))
        if not differing:
            return
        if time.time() > deadline:
            raise SystemExit(f"members' states differ after {timeout} s: {differing}")
        time.sleep(0.2)


def stop_all(members, root, keep_data=False):
    """Stops every member (SIGTERM, or SIGKILL if that fails) and removes their data, unless
    asked to keep it."""
    for m in members:
        try:
            m.stop()
        except Exception:
            if m.process:
                m.process.kill()
    if not keep_data:
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--writers-during-snapshot", type=int, default=0,
                        help="threads creating sessions through the two others while the "
                             "wiped member catches up (0: none)")
    parser.add_argument("--restart", action="store_true",
                        help="after each failover, also kill the member leading the most "
                             "groups and start it again at once on its data")
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member, e.g. "
                             "'--raft-workers 2'")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-recovery-")
    members = three_members(args.concord, root, args.groups, args.server_args.split())
    try:
        start_all(members)
        started = time.time()
        load(members, args.sessions)
        print(f"loaded {args.sessions} sessions in {time.time() - started:.1f} s", flush=True)
        for run in range(1, args.runs + 1):
            leads = {m.node: 0 for m in members}
            for group in status(members[0].address)["groups"]:
                leads[group["leader"]] = leads.get(group["leader"], 0) + 1
            victim_index = max(range(3), key=lambda i: leads[members[i].node])
            back, longest = failover(members, victim_index, run)
            victim = members[victim_index]
            victim.start()
            victim.wait_listening()
            wait_ready(members)
            while not caught_up(victim, [m for m in members if m is not victim]):
                time.sleep(0.05)
            print(f"failover run {run}: node {victim.node} killed, leaders back after "
                  f"{back:.3f} s, longest write {longest:.3f} s", flush=True)
            print(json.dumps({"case": "failover", "run": run, "groups": args.groups,
                              "leaders_back_secs": back, "longest_write_secs": longest}),
                  flush=True)

            if args.restart:
                leads = {m.node: 0 for m in members}
                for group in status(members[0].address)["groups"]:
                    leads[group["leader"]] = leads.get(group["leader"], 0) + 1
                victim_index = max(range(3), key=lambda i: leads[members[i].node])
                victim = members[victim_index]
                back, longest = restart_at_once(members, victim_index, run)
                wait_ready(members)
                while not caught_up(victim, [m for m in members if m is not victim]):
                    time.sleep(0.05)
                back_text = "never" if back is None else f"after {back:.3f} s"
                print(f"restart run {run}: node {victim.node} killed and started again, leaders "
                      f"back {back_text}, longest write {longest:.3f} s", flush=True)
                print(json.dumps({"case": "restart", "run": run, "groups": args.groups,
                                  "leaders_back_secs": back, "longest_write_secs": longest}),
                      flush=True)

            lost = members[2]
            others = members[:2]
            writers, before = None, None
            if args.writers_during_snapshot:
                # All three up, for the rate to hold the one during the catch-up against.
                writers = Writers(others, args.writers_during_snapshot, f"snapshot/{run}")
                time.sleep(1.0)
                writers.restart_clock()
                time.sleep(BASELINE_SECS)
                before = writers.restart_clock()[0] / BASELINE_SECS
            terms_at_kill = group_terms(members)
            lost.kill()
            shutil.rmtree(lost.data_dir)
            cpu_before = [m.cpu_secs() for m in others]
            restarted = time.time()
            lost.start("existing")
            lost.wait_listening()
            leaders_back_at = None
            while not caught_up(lost, others):
                waiting = writers and leaders_back_at is None
                if waiting and leaders_live(others, lost.node, terms_at_kill):
                    # From here on the writers wait for no election: what slows them is the
                    # snapshots being sent.
                    leaders_back_at = time.time()
                    writers.restart_clock()
                time.sleep(0.05)
            elapsed = time.time() - restarted
            cpu_senders = sum(m.cpu_secs() for m in others) - sum(cpu_before)
            cpu_receiver = lost.cpu_secs()  # started for this catch-up
            installed, installing_secs = installs(lost)
            fetched = fetches(lost)
            created, longest = writers.stop() if writers else (0, 0.0)
            since_leaders = time.time() - (leaders_back_at or time.time())
            peak = lost.peak_rss_bytes()
            sender_peaks = [m.peak_rss_bytes() for m in others]
            during = created / since_leaders if since_leaders > 0 else None
            under = ""
            if writers and during is None:
                under = (f" under {args.writers_during_snapshot} writers ({before:.0f} "
                         f"creates/s before the kill; caught up before the leaders were back)")
            elif writers:
                under = (f" under {args.writers_during_snapshot} writers ({before:.0f} "
                         f"creates/s before the kill; {during:.0f} from the leaders' return to "
                         f"the catch-up, {since_leaders:.2f} s, the longest sent then "
                         f"{longest:.3f} s)")
            print(f"snapshot run {run}: node 3 wiped and back with {args.sessions} sessions in "
                  f"{elapsed:.2f} s{under}; its peak RSS {peak / 2**20:.0f} MiB; senders' peak "
                  f"RSS {[round(p / 2**20) for p in sender_peaks]} MiB; senders' CPU "
                  f"{cpu_senders:.2f} s; its CPU {cpu_receiver:.2f} s; {installed} installs, "
                  f"{installing_secs:.2f} s installing; fetches (count, mean ms): "
                  f"{ {k: (n, round(secs * 1e3 / n, 2) if n else None) for k, (n, secs) in fetched.items()} }",
                  flush=True)
            if installed > args.groups:
                print(f"  note: {installed} installs for {args.groups} groups: a state was "
                      f"fetched again", flush=True)
            print(json.dumps({"case": "snapshot", "run": run, "sessions": args.sessions,
                              "groups": args.groups, "catch_up_secs": elapsed,
                              "peak_rss_bytes": peak, "sender_peak_rss_bytes": sender_peaks,
                              "sender_cpu_secs": cpu_senders,
                              "receiver_cpu_secs": cpu_receiver,
                              "installs": installed, "installing_secs": installing_secs,
                              "fetches": {k: {"count": n, "secs": secs}
                                          for k, (n, secs) in fetched.items()},
                              "writers": args.writers_during_snapshot,
                              "creates_per_sec_before": before,
                              "creates_per_sec_after_leaders_back": during,
                              "secs_after_leaders_back": since_leaders,
                              "longest_write_secs": longest}), flush=True)
            wait_ready(members)
            # Caught up by index is not yet the same state: the digests say so.
            check_digests(members, args.groups)
    finally:
        stop_all(members, root)


if __name__ == "__main__":
    main()
