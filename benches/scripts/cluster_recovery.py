#!/usr/bin/env python3
"""Three `concord` processes on loopback: how long a member's loss costs.

  failover  SIGKILL the member leading the most groups under write load: time until every
            group has a live leader again (as a survivor reports), and the longest single
            write the load saw around the kill.
  snapshot  SIGKILL a member, wipe its data directory, start it again: time until every
            group on it has applied what its leader had, and the peak RSS of the member
            that came back (its state arrived as snapshots) and of the others.

Usage (release build first: cargo build --release -p concord-http):
  python3 benches/scripts/cluster_recovery.py --sessions 1000000 --runs 5

Prints a line per run and a JSON line per run ({"case": "failover"|"snapshot", ...}).
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


class Member:
    def __init__(self, binary, node, members, data_dir, groups, server_args=()):
        self.binary, self.node, self.members = binary, node, members
        self.data_dir, self.groups = data_dir, groups
        self.server_args = list(server_args)
        self.process, self.address = None, None
        self.stderr = sys.stderr  # where the process's log goes

    def start(self, state="new"):
        self.process = subprocess.Popen(
            [self.binary, "serve", "--data-dir", self.data_dir, "--http-addr", "127.0.0.1:0",
             "--log-level", "warn", "--groups", str(self.groups),
             "--initial-cluster", self.members, "--node-id", str(self.node),
             "--initial-cluster-state", state, *self.server_args],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True)

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
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"content-type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def status(address):
    code, body = call(address, "GET", "/v1/status")
    return json.loads(body) if code == 200 else None


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


def failover(members, victim_index):
    """Kills members[victim_index] under load; returns (leaders back, longest write) secs."""
    survivors = [m for i, m in enumerate(members) if i != victim_index]
    victim = members[victim_index]
    stop = threading.Event()
    longest = [0.0]
    sequence = [0]

    def writer(member, index):
        n = 0
        while not stop.is_set():
            n += 1
            body = json.dumps({"client_id": f"failover/{index}/{sequence[0]}/{n}",
                               "broker_id": "b"})
            started = time.time()
            try:
                call(member.address, "POST", "/v1/sessions", body, 30)
            except OSError:
                pass
            longest[0] = max(longest[0], time.time() - started)

    writers = [threading.Thread(target=writer, args=(survivors[i % 2], i)) for i in range(8)]
    for w in writers:
        w.start()
    time.sleep(1.0)
    longest[0] = 0.0
    victim.kill()
    killed_at = time.time()
    back = None
    while time.time() - killed_at < 30:
        views = [status(s.address) for s in survivors]
        if all(v and all(g["leader"] not in (0, victim.node) for g in v["groups"]) for v in views):
            back = time.time() - killed_at
            break
        time.sleep(0.01)
    time.sleep(1.0)
    stop.set()
    for w in writers:
        w.join()
    return back, longest[0]


def caught_up(member, others):
    """Every group on `member` has applied as far as on every other member."""
    mine = status(member.address)
    if not mine:
        return False
    targets = {}
    for other in others:
        for group in status(other.address)["groups"]:
            targets[group["group"]] = max(targets.get(group["group"], 0), group["applied_index"])
    return all(g["applied_index"] >= targets[g["group"]] for g in mine["groups"])


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
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-recovery-")
    ports = free_ports(3)
    flag = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    members = [Member(args.concord, i + 1, flag, os.path.join(root, str(i + 1)), args.groups)
               for i in range(3)]
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
            back, longest = failover(members, victim_index)
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

            lost = members[2]
            lost.kill()
            shutil.rmtree(lost.data_dir)
            others = members[:2]
            cpu_before = [m.cpu_secs() for m in others]
            restarted = time.time()
            lost.start("existing")
            lost.wait_listening()
            while not caught_up(lost, others):
                time.sleep(0.05)
            elapsed = time.time() - restarted
            cpu_senders = sum(m.cpu_secs() for m in others) - sum(cpu_before)
            peak = lost.peak_rss_bytes()
            sender_peaks = [m.peak_rss_bytes() for m in others]
            print(f"snapshot run {run}: node 3 wiped and back with {args.sessions} sessions in "
                  f"{elapsed:.2f} s; its peak RSS {peak / 2**20:.0f} MiB; senders' peak RSS "
                  f"{[round(p / 2**20) for p in sender_peaks]} MiB; senders' CPU "
                  f"{cpu_senders:.2f} s", flush=True)
            print(json.dumps({"case": "snapshot", "run": run, "sessions": args.sessions,
                              "groups": args.groups, "catch_up_secs": elapsed,
                              "peak_rss_bytes": peak, "sender_peak_rss_bytes": sender_peaks,
                              "sender_cpu_secs": cpu_senders}), flush=True)
            wait_ready(members)
    finally:
        stop_all(members, root)


if __name__ == "__main__":
    main()
