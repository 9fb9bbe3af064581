#!/bin/bash
# The server CPU one HTTP probe costs on a node of 10,000 groups.
#
# usage: benches/scripts/probe_cost.sh CONCORD_BINARY URL_PATH [CALLS]
# Starts `concord serve --groups 10000` (the WAL) in a temporary directory, waits until
# /readyz answers and 5 s more, makes CALLS sequential curl calls to URL_PATH, then measures the
# server's idle CPU over a window of the same length and subtracts it. Prints one line:
# URL_PATH cpu_ms_per_call N wall_ms_per_call N (wall time includes curl's own start-up).
set -euo pipefail
BIN=$1
URL_PATH=$2
CALLS=${3:-50}
DIR=$(mktemp -d /tmp/probe_cost.XXXX)
PORT=$((20000 + RANDOM % 20000))
"$BIN" serve --data-dir "$DIR/data" --http-addr "127.0.0.1:$PORT" --groups 10000 > "$DIR/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 1 600); do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" && break
  sleep 0.1
done
sleep 5
TICKS_PER_SEC=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
BUSY_START=$(cpu_ticks); T0=$(date +%s%N)
for _ in $(seq 1 "$CALLS"); do curl -s -o /dev/null "http://127.0.0.1:$PORT$URL_PATH"; done
T1=$(date +%s%N); BUSY_END=$(cpu_ticks)
WINDOW_MS=$(( (T1 - T0) / 1000000 ))
IDLE_START=$(cpu_ticks); sleep "$(echo "scale=3; $WINDOW_MS / 1000" | bc)"; IDLE_END=$(cpu_ticks)
CPU_MS=$(echo "scale=2; (($BUSY_END - $BUSY_START) - ($IDLE_END - $IDLE_START)) * 1000 / $TICKS_PER_SEC / $CALLS" | bc)
echo "$URL_PATH cpu_ms_per_call $CPU_MS wall_ms_per_call $(echo "scale=2; $WINDOW_MS / $CALLS" | bc)"
