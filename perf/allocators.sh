#!/usr/bin/env bash
# A/B/C of kvpick's memory set-up: `kvpick serve` built with mimalloc (the
# default, transparent huge pages off), the same with
# `--transparent-huge-pages allowed`, and built with jemalloc
# (`--features jemalloc`), under the same kvpick-load run, alternating
# A, B, C, A, B, C… so drift on a shared machine hits all alike. Prints
# each run and each variant's ratios to the default of requests/s, p50,
# p99 and peak RSS.
#
#   perf/allocators.sh                 # 3 rounds × 10 s at concurrency 16
#   ROUNDS=5 DURATION=20s CONC=64 perf/allocators.sh
#
# Everything runs on 127.0.0.1: a simulated engine as the render
# (tokenizer) service, kvpick in static mode over 8 workers, kvpick-load
# driving ext_proc like a gateway (1,000-token chat prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONC=${CONC:-16}
OUT=target/allocators
mkdir -p "$OUT"

echo "== building (release): kvpick with mimalloc, with jemalloc; kvpick-load; kvpick-sim" >&2
cargo build --release -q -p kvpick-app --bin kvpick
cp target/release/kvpick "$OUT/kvpick-mimalloc"
cargo build --release -q -p kvpick-app --bin kvpick --features jemalloc
cp target/release/kvpick "$OUT/kvpick-jemalloc"
cargo build --release -q -p kvpick-app --bin kvpick   # leave the default build in place
cargo build --release -q -p kvpick-perf --bin kvpick-load
cargo build --release -q -p kvpick-sim --bin kvpick-sim

# shellcheck source=perf/serve_env.sh
source perf/serve_env.sh
start_render

write_workers

run() { # variant round
  local variant=$1 round=$2 log="$OUT/$1-$2" binary=kvpick-${1%-thp} thp=never
  [[ $variant == *-thp ]] && thp=allowed
  "$OUT/$binary" serve --transparent-huge-pages "$thp" --workers-file "$OUT/workers.json" --listen-address 127.0.0.1 \
    --ext-proc-port 19002 --health-port 19003 --metrics-port 19090 --shards 1 \
    --tokenizer-url "$render" --model sim-model --log warn 2>"$log.stderr" &
  local pid=$!
  pids+=("$pid")
  wait_port 19002
  ./target/release/kvpick-load --addr 127.0.0.1:19002 -c "$CONC" -z "$DURATION" --no-progress \
    --format json >"$log.json"
  local hwm
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  kill -TERM "$pid"
  wait "$pid" || true
  python3 - "$log.json" "$variant" "$round" "$hwm" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lat = {p["percentage"]: p["latency"] / 1e6 for p in d["latencyDistribution"]}
ok = d["statusCodeDistribution"].get("OK", d["count"])
print(f'{sys.argv[2]:<9} round {sys.argv[3]}  {d["rps"]:>8.0f} req/s  p50 {lat[50.0]:6.3f} ms  '
      f'p99 {lat[99.0]:6.3f} ms  peak RSS {int(sys.argv[4]) / 1024:6.1f} MiB  ok {ok}/{d["count"]}')
PY
}

echo "== $ROUNDS rounds × $DURATION, concurrency $CONC" >&2
for round in $(seq "$ROUNDS"); do
  run mimalloc "$round"
  run mimalloc-thp "$round"
  run jemalloc "$round"
done | tee "$OUT/runs.txt"

python3 - "$OUT/runs.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r'([\w-]+)\s+round \d+\s+(\d+) req/s\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms\s+peak RSS\s+([\d.]+) MiB', line)
    if m:
        rows.setdefault(m[1], []).append([float(x) for x in m.groups()[1:]])
med = {k: [statistics.median(c) for c in zip(*v)] for k, v in rows.items()}
names = ["req/s", "p50 ms", "p99 ms", "peak RSS MiB"]
print("\nmedians       " + "  ".join(f"{n:>12}" for n in names))
for k in ("mimalloc", "mimalloc-thp", "jemalloc"):
    print(f"{k:<13} " + "  ".join(f"{x:>12.3f}" for x in med[k]))
for k in ("mimalloc-thp", "jemalloc"):
    print(f"{k} ÷ mimalloc " + "  ".join(f"{j / m:>6.2f}×" for j, m in zip(med[k], med["mimalloc"])))
PY
