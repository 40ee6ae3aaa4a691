#!/usr/bin/env bash
# ext_proc throughput and latency of the real `kvpick serve` (static mode,
# 8 workers, a simulated engine's HTTP render endpoint as the tokenizer, so
# every pick is KV-aware and pays a render round trip) next to the null
# picker (same ext_proc server code, pick = first endpoint, no tokenizing,
# no shards), at concurrency 1, 16 and 64, alternating the two in one run.
#
#   perf/serve_vs_null.sh                     # 2 rounds × 10 s per point
#   ROUNDS=3 DURATION=20s perf/serve_vs_null.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
OUT=target/serve-vs-null
mkdir -p "$OUT"

# shellcheck source=perf/serve_env.sh
source perf/serve_env.sh
start_serve_and_null 19102

summary() { # label concurrency file
  python3 - "$@" <<'PY'
import json, sys
label, conc, path = sys.argv[1:4]
d = json.load(open(path))
lat = {p["percentage"]: p["latency"] / 1e6 for p in d["latencyDistribution"]}
ok = d["statusCodeDistribution"].get("OK", 0)
print(f"{label:<12} c={conc:<3} {d['rps']:>8.0f} req/s  p50 {lat[50.0]:7.3f} ms  p99 {lat[99.0]:7.3f} ms  ok {ok}/{d['count']}")
PY
}

for round in $(seq "$ROUNDS"); do
  for c in 1 16 64; do
    ./target/release/kvpick-load --addr "$null" -c "$c" -z "$DURATION" --no-progress --format json >"$OUT/null-$c-$round.json"
    summary null "$c" "$OUT/null-$c-$round.json"
    ./target/release/kvpick-load --addr 127.0.0.1:19102 -c "$c" -z "$DURATION" --no-progress --format json \
      >"$OUT/serve-$c-$round.json"
    summary "kvpick serve" "$c" "$OUT/serve-$c-$round.json"
  done
done | tee "$OUT/runs.txt"

ratio_table "$OUT/runs.txt" req/s
