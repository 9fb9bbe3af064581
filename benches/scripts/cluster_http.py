#!/usr/bin/env python3
"""HTTP creates (or another workload of `concord-bench http`) against three `concord`
processes on loopback: through the leader and through a follower (which forwards every write
to the leader, and asks it for every linearizable read's index), alternated.

One group by default, so that one member leads every write. Each case runs
`concord-bench http` and reads the three servers' CPU time from /proc around it.

Usage (release build first: cargo build --release -p concord-http -p concord-bench):
  python3 benches/scripts/cluster_http.py --runs 5 --connections 256 --duration-secs 10
  # the same with nothing on disk and the session logic native: the floor under the storage
  python3 benches/scripts/cluster_http.py --runs 5 --server-args '--backend mem --native-sessions true'
  # linearizable reads of existing sessions (the load tool creates them first)
  python3 benches/scripts/cluster_http.py --runs 5 --workload get:linearizable

Prints a line per case with, under it, each member's CPU per request by kind of thread
(`concord-http`, `concord-raft`, `concord-apply`, ...), and a JSON line per case
({"case": "cluster_http", ...}, the same split in `servers_cpu_us_per_create_by_thread`, and
the load tool's own CPU per request in `load_tool_cpu_us_per_create`: on one machine it takes
its share of the cores the servers run on), then the medians.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

from cluster_recovery import start_all, status, stop_all, three_members


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--bench", default="target/release/concord-bench")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--duration-secs", type=int, default=10)
    parser.add_argument("--workload", default="create",
                        help="the load tool's --workload (create, get:linearizable, ...)")
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member, e.g. "
                             "'--backend mem --native-sessions true'")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-cluster-http-")
    members = three_members(args.concord, root, args.groups, args.server_args.split())
    results = {"leader": [], "follower": []}
    ops = "creates" if args.workload == "create" else f"{args.workload} ops"
    op = "create" if args.workload == "create" else "op"
    try:
        start_all(members)
        for run in range(1, args.runs + 1):
            order = ["leader", "follower"] if run % 2 else ["follower", "leader"]
            for target in order:
                view = status(members[0].address)
                leader = view["groups"][0]["leader"]
                member = next(m for m in members if (m.node == leader) == (target == "leader"))
                cpu_before = sum(m.cpu_secs() for m in members)
                threads_before = [m.cpu_secs_by_thread() for m in members]
                tool_before = children_cpu_secs()
                out = subprocess.run(
                    [args.bench, "http", "--address", member.address,
                     "--connections", str(args.connections),
                     "--workload", args.workload,
                     "--duration-secs", str(args.duration_secs)],
                    capture_output=True, text=True, check=True).stdout
                cpu = sum(m.cpu_secs() for m in members) - cpu_before
                # The load tool shares the machine's cores with the servers: its share is what
                # the servers could not have.
                tool_cpu = children_cpu_secs() - tool_before
                threads_after = [m.cpu_secs_by_thread() for m in members]
                line = json.loads(next(l for l in out.splitlines() if l.startswith("{")))
                requests = line["requests"] + sum(line["errors_by_status"].values())
                cpu_us = cpu * 1e6 / requests if requests else float("nan")
                tool_cpu_us = tool_cpu * 1e6 / requests if requests else float("nan")
                # Per member, each kind of thread's CPU per request (threads that ended during
                # the run are missing from both sides of the difference).
                by_thread = {}
                for m, before, after in zip(members, threads_before, threads_after):
                    by_thread[f"node{m.node}"] = {
                        kind: round((secs - before.get(kind, 0.0)) * 1e6 / requests, 2)
                        for kind, secs in after.items() if requests
                    }
                # `creates_per_sec` and `servers_cpu_us_per_create` name the default workload:
                # with another one they are its operations.
                result = {"case": "cluster_http", "run": run, "through": target,
                          "workload": args.workload,
                          "server_args": args.server_args,
                          "groups": args.groups, "connections": args.connections,
                          "creates_per_sec": line["ops_per_sec"],
                          "p50_us": line["p50_us"], "p99_us": line["p99_us"],
                          "errors": sum(line["errors_by_status"].values()), "servers_cpu_us_per_create": cpu_us,
                          "servers_cpu_us_per_create_by_thread": by_thread,
                          "load_tool_cpu_us_per_create": tool_cpu_us,
                          "core_round_trip_ns": line.get("core_round_trip_ns"),
                          "core_round_trip_after_ns": line.get("core_round_trip_after_ns")}
                results[target].append(result)
                print(f"run {run} through the {target} (node {member.node}): "
                      f"{result['creates_per_sec']:.0f} {ops}/s, p50 {result['p50_us']} µs, "
                      f"p99 {result['p99_us']} µs, servers' CPU {cpu_us:.0f} µs/{op}, "
                      f"the load tool's {tool_cpu_us:.0f}, "
                      f"a cache line's round trip between cores {result['core_round_trip_ns'] or 0:.0f} ns "
                      f"before, {result['core_round_trip_after_ns'] or 0:.0f} after",
                      flush=True)
                for m in members:
                    role = "leader" if m.node == leader else "follower"
                    role += ", the load's target" if m is member else ""
                    threads = by_thread[f"node{m.node}"]
                    shown = ", ".join(f"{kind} {us:.1f}" for kind, us in
                                      sorted(threads.items(), key=lambda kv: -kv[1]) if us >= 0.3)
                    print(f"    node {m.node} ({role}): {sum(threads.values()):.1f} µs/{op}: "
                          f"{shown}", flush=True)
                print(json.dumps(result), flush=True)
        for target, runs in results.items():
            print(f"median through the {target}: "
                  f"{statistics.median(r['creates_per_sec'] for r in runs):.0f} {ops}/s, "
                  f"p50 {statistics.median(r['p50_us'] for r in runs):.0f} µs, "
                  f"p99 {statistics.median(r['p99_us'] for r in runs):.0f} µs, servers' CPU "
                  f"{statistics.median(r['servers_cpu_us_per_create'] for r in runs):.0f} "
                  f"µs/{op}")
    finally:
        stop_all(members, root)


def children_cpu_secs():
    """CPU seconds (user and system) of this script's children that have been waited for."""
    times = os.times()
    return times.children_user + times.children_system


if __name__ == "__main__":
    main()
