#!/usr/bin/env bash
# The GAIE reference EPP beside kvpick on the same ext_proc load, in one run
# (issue #24 part 3). kvpick-load drives each server in turn, interleaved:
#   gaie      the GAIE EPP (standalone mode: --endpoint-selector), its 8
#             endpoints stand-in vLLM servers whose /metrics it scrapes
#   null      kvpick's server with the null picker (in-process, --spawn)
#   kv        kvpick's KvPicker (in-process, --spawn kv-inline: word
#             tokenizer, an inline shard as kvpick serve runs by default,
#             8 workers, each system prompt cached on 2)
# The stand-ins and the fake API server run through every round, so each
# server shares the machine with the same background.
#
# GAIE_EPP must point at a built EPP binary; nothing here builds it (see
# perf/README.md, "GAIE's EPP beside kvpick", for the commit and command).
#
#   GAIE_EPP=/path/to/epp perf/gaie/run.sh [ROUNDS (2)] [DURATION (10s)] [CONCURRENCY ("1 16 64")]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GAIE_EPP:?set GAIE_EPP to a built GAIE EPP binary}"
rounds=${1:-2}
duration=${2:-10s}
levels=${3:-1 16 64}
api_port=${API_PORT:-16443}
grpc_port=${GAIE_GRPC_PORT:-19002}
ports=$(seq -s, 18001 18008)
cargo build --release -q -p kvpick-perf --bin kvpick-load
load=target/release/kvpick-load
out=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT

python3 perf/gaie/fake_apiserver.py "$api_port" vllm-0=127.0.0.1 2> "$out/api.log" & pids+=($!)
python3 perf/gaie/fake_vllm_metrics.py 127.0.0.1 "$ports" & pids+=($!)
cat > "$out/kubeconfig" <<KUBE
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$api_port"}}]
contexts: [{name: fake, context: {cluster: fake, user: fake, namespace: default}}]
current-context: fake
users: [{name: fake, user: {token: fake}}]
KUBE
sleep 1
# POD_NAME: the EPP takes its pool's name from its own pod's.
KUBECONFIG="$out/kubeconfig" POD_NAME=epp-abc12-xyz34 "$GAIE_EPP" \
  --endpoint-selector app=fake-vllm --endpoint-target-ports "$ports" \
  --grpc-port "$grpc_port" --grpc-health-port $((grpc_port + 1)) --metrics-port $((grpc_port + 2)) \
  --secure-serving=false --metrics-endpoint-auth=false --tracing=false --enable-pprof=false \
  > "$out/epp.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do
  grep -q "Pod already exists\|starting collection" "$out/epp.log" 2>/dev/null && break
  sleep 0.2
done
sleep 2

run() { # kind concurrency round
  local args=(--spawn "$1")
  [ "$1" = gaie ] && args=(--addr "127.0.0.1:$grpc_port")
  [ "$1" = kv ] && args=(--spawn kv-inline)
  "$load" "${args[@]}" -c "$2" -z "$duration" > "$out/$1-$2-$3.txt" 2>&1
  if ! grep -q "ended: timeout" "$out/$1-$2-$3.txt"; then
    echo "kvpick-load against $1 at $2 did not run its time:" >&2
    tail -20 "$out/$1-$2-$3.txt" >&2
    exit 1
  fi
}
rate() { awk '/Requests\/sec:/ {print $2; exit}' "$1"; }
quantile() { # file percent → µs
  awk -v q="$2 %" 'index($0, q " in ") {v = $(NF-1); u = $NF
    if (u == "ms") v *= 1000; else if (u == "s") v *= 1000000; else if (u == "ns") v /= 1000
    print v; exit}' "$1"
}
# Status lines are "  [name]<TAB>N responses"; names may hold spaces.
failed() { awk -F'\t' '/^Status code distribution/ {s=1; next} /^$/ {s=0} s && /^[ \t]*\[/ && !/\[OK\]/ {n += $2 + 0} END {print n + 0}' "$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "| concurrency | server | requests/s | p50 µs | p99 µs | not OK | requests/s ÷ GAIE EPP |"
echo "|---:|---|---:|---:|---:|---:|---:|"
for c in $levels; do
  for r in $(seq "$rounds"); do
    for kind in gaie null kv; do run "$kind" "$c" "$r"; done
  done
  gaie_rate=$(for r in $(seq "$rounds"); do rate "$out/gaie-$c-$r.txt"; done | median)
  for kind in gaie null kv; do
    rps=$(for r in $(seq "$rounds"); do rate "$out/$kind-$c-$r.txt"; done | median)
    p50=$(for r in $(seq "$rounds"); do quantile "$out/$kind-$c-$r.txt" 50; done | median)
    p99=$(for r in $(seq "$rounds"); do quantile "$out/$kind-$c-$r.txt" 99; done | median)
    bad=$(for r in $(seq "$rounds"); do failed "$out/$kind-$c-$r.txt"; done | awk '{s += $1} END {print s + 0}')
    ratio=$(awk -v a="$rps" -v b="$gaie_rate" 'BEGIN {printf "%.2f×", a / b}')
    printf "| %s | %s | %.0f | %.1f | %.1f | %s | %s |\n" "$c" "$kind" "$rps" "$p50" "$p99" "$bad" "$ratio"
  done
done
echo
echo "- $rounds interleaved rounds of $duration per server and concurrency (kvpick-load, one HTTP/2 connection); medians of the rounds; GAIE EPP $("$GAIE_EPP" --version 2>/dev/null | head -1 || true); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%d)"
