#!/usr/bin/env python3
"""The soak: one `concord serve` (its defaults: the log in the WAL, the state in redb, 8 groups)
with a million or more resident sessions, under an
open-loop mix of reads, patches, creates, expiring creates and deletes at half of what it can
serve, for ten minutes.

Steps: start the server on a fresh data directory; load the resident sessions with batched
creates; measure capacity with the soak mix in closed loop; run the mix in open loop at
`--load-fraction` of that capacity (or at `--rate`, to compare two builds at one load) for
`--duration-secs`; print the server's RSS and the p99
at the start, middle and end of the run, the errors, and the sessions the expiry scan removed;
write the load tool's report.

Usage (release build first: cargo build --release -p concord-http -p concord-bench):
  python3 benches/scripts/soak.py --sessions 1000000 --duration-secs 600 --report soak.html

Prints the load tool's output and a JSON line {"case": "soak", ...} at the end.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(args, address, *flags):
    """Runs `concord-bench http` and returns its JSON results (one per case)."""
    command = [args.bench, "http", "--address", address, "--quiet", *flags]
    print("$", " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    print("\n".join(l for l in out.splitlines() if not l.startswith("{")), flush=True)
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")], out


def metric(address, name):
    """The sum of a Prometheus counter's series on `address`'s /metrics."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def at_fraction(timeline, fraction):
    """The timeline's second nearest `fraction` of the way through, averaged over 5 s."""
    middle = round((len(timeline) - 1) * fraction)
    window = timeline[max(0, middle - 2):middle + 3]
    return {
        "at_secs": round(timeline[middle]["at_secs"]),
        "ops_per_sec": round(statistics.mean(s["ops_per_sec"] for s in window)),
        "p99_us": round(statistics.median(s["p99_us"] for s in window)),
        "server_rss_mib": round(max(s["server_rss_bytes"] or 0 for s in window) / 2**20),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--bench", default="target/release/concord-bench")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--duration-secs", type=int, default=600)
    parser.add_argument("--load-fraction", type=float, default=0.5)
    parser.add_argument("--rate", type=int, default=None,
                        help="a fixed open-loop rate in ops/s instead of load-fraction of the "
                             "capacity measured, to compare two builds at one load")
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--report", default="soak.html")
    parser.add_argument("--serve-args", default="",
                        help="more flags for `concord serve`, e.g. '--session-expiry-scan-ms 0'")
    args = parser.parse_args()

    data = tempfile.mkdtemp(prefix="concord-soak-")
    address = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [args.concord, "serve", "--data-dir", data, "--http-addr", address,
         "--log-level", "warn", *args.serve_args.split()])
    try:
        for _ in range(200):
            try:
                host, port = address.split(":")
                socket.create_connection((host, int(port)), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        # Resident sessions: batches of 100 creates, an hour's expiry each.
        loaded = 0
        while loaded < args.sessions:
            results, _ = bench(args, address, "--workload", "batch:100", "--connections", "32",
                               "--duration-secs", "20", "--server-pid", str(server.pid))
            loaded += results[0]["ops"]
            print(f"resident sessions: {loaded}", flush=True)
        capacity_run, _ = bench(args, address, "--workload", "soak", "--connections",
                                str(args.connections), "--duration-secs", "20",
                                "--server-pid", str(server.pid))
        capacity = capacity_run[0]["ops_per_sec"]
        rate = args.rate or round(capacity * args.load_fraction)
        expired_before = metric(address, "concord_sessions_expired_total")
        soak, output = bench(args, address, "--workload", "soak", "--connections",
                             str(args.connections), "--rate", str(rate), "--duration-secs",
                             str(args.duration_secs), "--server-pid", str(server.pid),
                             "--label", "soak", "--report", args.report)
        expired = metric(address, "concord_sessions_expired_total") - expired_before
        result = soak[0]
        timeline = result["timeline"]
        summary = {
            "case": "soak",
            "resident_sessions": loaded,
            "capacity_ops_per_sec": round(capacity),
            "rate_per_sec": rate,
            "seconds": round(result["seconds"]),
            "ops": result["ops"],
            "errors": sum(result["errors_by_status"].values()),
            "unsent_requests": result["unsent_requests"],
            "p99_us": result["p99_us"],
            "server_p99_us": result.get("server_p99_us"),
            "sessions_expired": round(expired),
            "server_cpu_us_per_op": result["server_cpu_us_per_op"],
            "start": at_fraction(timeline, 0.0),
            "middle": at_fraction(timeline, 0.5),
            "end": at_fraction(timeline, 1.0),
        }
        for point in ("start", "middle", "end"):
            p = summary[point]
            print(f"{point:>6} ({p['at_secs']:>4} s): {p['ops_per_sec']} ops/s, "
                  f"p99 {p['p99_us'] / 1000:.1f} ms, server RSS {p['server_rss_mib']} MiB")
        print(f"p99 over the run {summary['p99_us'] / 1000:.1f} ms (the server's own "
              f"{(summary['server_p99_us'] or 0) / 1000:.1f} ms)")
        print(f"errors {summary['errors']}, unsent {summary['unsent_requests']}, "
              f"sessions expired {summary['sessions_expired']}")
        print(json.dumps(summary), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
