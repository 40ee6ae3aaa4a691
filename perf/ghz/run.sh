#!/usr/bin/env bash
# ghz against `kvpick serve` (static mode, 8 workers, a simulated engine's
# render endpoint as the tokenizer: every pick is KV-aware and pays a
# render round trip) and against the null picker (same ext_proc server,
# pick = first endpoint, no tokenizing, no shards), alternating the two in
# one run at concurrency 1, 16 and 64, with the stream of data.json.
#
#   perf/ghz/run.sh                      # 2 rounds × 10 s per point
#   ROUNDS=3 DURATION=20s perf/ghz/run.sh
#   SMOKE=1 perf/ghz/run.sh              # CI: 200 streams each, checks every one is OK
#
# Needs ghz on PATH (or $GHZ): go install github.com/bojand/ghz/cmd/ghz@v0.120.0
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
SMOKE=${SMOKE:-}
GHZ=${GHZ:-$(command -v ghz || echo "$(go env GOPATH 2>/dev/null)/bin/ghz")}
OUT=target/ghz
mkdir -p "$OUT"
[ -x "$GHZ" ] || { echo "no ghz (set GHZ or install it: go install github.com/bojand/ghz/cmd/ghz@v0.120.0)" >&2; exit 1; }

[ -d perf/ghz/protos/data-plane-api ] || (cd perf/ghz && ./fetch-protos.sh >&2)
# shellcheck source=perf/serve_env.sh
source perf/serve_env.sh
start_serve_and_null 19202

ghz_run() { # address concurrency output
  local amount=(-z "$DURATION")
  [ -n "$SMOKE" ] && amount=(-n 200)
  (cd perf/ghz && "$GHZ" --config config.json "${amount[@]}" -c "$2" --connections 1 -O json "$1") >"$3"
}

summary() { # label concurrency file [timed]
  python3 - "$@" <<'PY'
import json, sys
label, conc, path = sys.argv[1:4]
d = json.load(open(path))
lat = {p["percentage"]: p["latency"] / 1e6 for p in d.get("latencyDistribution") or []}
ok = d.get("statusCodeDistribution", {}).get("OK", 0)
print(f"{label:<12} c={conc:<3} {d['rps']:>8.0f} streams/s  p50 {lat.get(50, 0):7.3f} ms  p99 {lat.get(99, 0):7.3f} ms"
      f"  ok {ok}/{d['count']}  errors {d.get('errorDistribution') or {}}")
# A timed run (-z) cancels the streams in flight when time is up, by
# closing its own connection: at most one per concurrent worker, and only
# those, may end that way.
closing = ("client connection is closing", "use of closed network connection", "transport is closing")
cut = sum(n for e, n in (d.get("errorDistribution") or {}).items() if any(c in e for c in closing))
if d["count"] - ok > (int(conc) if cut == d["count"] - ok and len(sys.argv) > 4 else 0):
    sys.exit(f"{label} c={conc}: {d['count'] - ok} of {d['count']} streams failed")
PY
}

timed=timed
if [ -n "$SMOKE" ]; then
  timed=
  ROUNDS=1
  concurrencies=(4)
else
  concurrencies=(1 16 64)
fi
for round in $(seq "$ROUNDS"); do
  for c in "${concurrencies[@]}"; do
    ghz_run "$null" "$c" "$OUT/null-$c-$round.json"
    summary null "$c" "$OUT/null-$c-$round.json" $timed
    ghz_run 127.0.0.1:19202 "$c" "$OUT/serve-$c-$round.json"
    summary "kvpick serve" "$c" "$OUT/serve-$c-$round.json" $timed
  done
done | tee "$OUT/runs.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
[ -n "$SMOKE" ] && exit 0

ratio_table "$OUT/runs.txt" streams/s
