# Sourced by the scripts that load-test `kvpick serve` (allocators.sh,
# serve_vs_null.sh): background processes stopped on exit, a simulated
# engine as the render (tokenizer) service, and a workers file of eight
# endpoints nobody serves (kvpick-load plays the engines' responses itself;
# their KV-event sockets just stay unconnected). Expects $OUT.

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Starts kvpick-sim with one engine; sets $render to its base URL.
start_render() {
  ./target/release/kvpick-sim --engines 1 --json >"$OUT/sim.json" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$OUT/sim.json" ] && break; sleep 0.1; done
  render=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["engines"][0]["http"])' "$OUT/sim.json")
}

# Writes $OUT/workers.json.
write_workers() {
  python3 - "$OUT/workers.json" <<'PY'
import json, sys
json.dump([{"endpoint": f"127.0.0.{10 + i}:8000", "kv_events": f"tcp://127.0.0.{10 + i}:5557"} for i in range(8)],
          open(sys.argv[1], "w"))
PY
}

# Waits until something listens on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done
}

# Builds the release binaries, then starts the render engine, `kvpick serve`
# (static mode, the workers file, ext_proc on 127.0.0.1:$1, health $1+1,
# metrics $1+88) and the null picker in a process of its own, so both
# servers share the machine with the client the same way. Sets $render and
# $null (the null picker's address).
start_serve_and_null() {
  echo "== building (release): kvpick, kvpick-load, kvpick-sim" >&2
  cargo build --release -q -p kvpick-app --bin kvpick -p kvpick-perf --bin kvpick-load -p kvpick-sim --bin kvpick-sim
  start_render
  write_workers
  ./target/release/kvpick serve --workers-file "$OUT/workers.json" --listen-address 127.0.0.1 \
    --ext-proc-port "$1" --health-port "$(($1 + 1))" --metrics-port "$(($1 + 88))" --tokenizer-url "$render" \
    --model sim-model --log warn 2>"$OUT/serve.stderr" &
  pids+=($!)
  wait_port "$1"
  ./target/release/kvpick-load --spawn null --serve-for 3600s >"$OUT/null.stdout" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q 'listening on' "$OUT/null.stdout" 2>/dev/null && break; sleep 0.05; done
  null=$(grep -o 'listening on [0-9.:]*' "$OUT/null.stdout" | awk '{print $3}')
}

# The medians of runs.txt's lines (`<null|kvpick serve> c=N <rate> <unit>
# p50 <ms> ms p99 <ms> ms`) per concurrency, as a markdown table with the
# ratio of the two rates. Usage: ratio_table FILE UNIT.
ratio_table() {
  python3 - "$1" "$2" <<'PY'
import re, statistics, sys
path, unit = sys.argv[1:3]
rows = {}
for line in open(path):
    m = re.match(r'(null|kvpick serve)\s+c=(\d+)\s+(\d+) ' + re.escape(unit) + r'\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms', line)
    if m:
        rows.setdefault((m[1], int(m[2])), []).append((float(m[3]), float(m[4]), float(m[5])))
print(f"\n| concurrency | null {unit} | kvpick serve {unit} | ratio | null p50 / p99 (ms) | kvpick serve p50 / p99 (ms) |")
print("|---:|---:|---:|---:|---:|---:|")
for c in (1, 16, 64):
    n = [statistics.median(x) for x in zip(*rows[("null", c)])]
    k = [statistics.median(x) for x in zip(*rows[("kvpick serve", c)])]
    print(f"| {c} | {n[0]:,.0f} | {k[0]:,.0f} | {k[0] / n[0]:.2f}× | {n[1]:.2f} / {n[2]:.2f} | {k[1]:.2f} / {k[2]:.2f} |")
PY
}
