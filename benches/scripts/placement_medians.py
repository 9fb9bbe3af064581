#!/usr/bin/env python3
"""Medians of `concord-bench consensus` runs, kept apart by the placement of the cores.

Each case's JSON line carries a cache line's round trip between two cores, measured before and
after the case (`core_round_trip_ns`, `core_round_trip_after_ns`). A case is "near" when both
are under the threshold, "far" when both are at or over it, and "mixed" otherwise (the
placement changed during the case, or a reading is missing): mixed cases are counted, not used.

Each file is one run of one command (its cases alternate with those of the other files).
Within a file, every case is also compared with the file's case of `--baseline-groups` groups
(same backend, nodes, transport and proposers) when both are in the same placement: the ratios
pair by pair, as the issues' "N groups against one" lines ask.

    python3 benches/scripts/placement_medians.py runs/r*-mem.txt [--threshold-ns 150]
"""

import argparse
import json
import statistics
from collections import defaultdict


def placement(case, threshold_ns):
    readings = [case.get("core_round_trip_ns"), case.get("core_round_trip_after_ns")]
    if any(reading is None for reading in readings):
        return "mixed"
    if all(reading < threshold_ns for reading in readings):
        return "near"
    if all(reading >= threshold_ns for reading in readings):
        return "far"
    return "mixed"


def shape(case):
    """What a case is, without its group count."""
    return (case["backend"], case["nodes"], case["transport"], case["proposers"])


def read_cases(path):
    with open(path) as lines:
        return [json.loads(line) for line in lines
                if line.startswith("{") and '"case":"consensus"' in line.replace(" ", "")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--threshold-ns", type=float, default=150.0)
    parser.add_argument("--baseline-groups", type=int, default=1)
    args = parser.parse_args()

    rates = defaultdict(list)   # (shape, groups, placement) -> [(ops/s, cpu µs/op)]
    ratios = defaultdict(list)  # (shape, groups, placement) -> [ratio against the baseline]
    for path in args.files:
        cases = read_cases(path)
        baselines = {shape(case): case for case in cases
                     if case["groups"] == args.baseline_groups}
        for case in cases:
            where = placement(case, args.threshold_ns)
            key = (shape(case), case["groups"], where)
            rates[key].append((case["ops_per_sec"], case.get("cpu_us_per_op")))
            baseline = baselines.get(shape(case))
            if (baseline is not None and case is not baseline and where != "mixed"
                    and placement(baseline, args.threshold_ns) == where):
                ratios[key].append(case["ops_per_sec"] / baseline["ops_per_sec"])

    print(f"{'backend':<7} {'nodes':>5} {'net':<6} {'proposers':>9} {'groups':>6} "
          f"{'placement':<9} {'runs':>4} {'ops/s':>10} {'cpu_us/op':>9}  ratios against "
          f"{args.baseline_groups} group(s), pair by pair")
    for key in sorted(rates):
        (backend, nodes, transport, proposers), groups, where = key
        runs = rates[key]
        cpu = [c for _, c in runs if c is not None]
        pairs = sorted(ratios.get(key, []))
        pair_text = (" ".join(f"{r:.2f}" for r in pairs)
                     + (f" (median {statistics.median(pairs):.2f})" if pairs else ""))
        print(f"{backend:<7} {nodes:>5} {transport:<6} {proposers:>9} {groups:>6} {where:<9} "
              f"{len(runs):>4} {statistics.median(r for r, _ in runs) / 1e3:>9.0f}k "
              f"{(statistics.median(cpu) if cpu else float('nan')):>9.2f}  {pair_text}")


if __name__ == "__main__":
    main()
