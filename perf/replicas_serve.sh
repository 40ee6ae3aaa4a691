#!/usr/bin/env bash
# Replica sync under kvpick-load (issue #22): two `kvpick serve` replicas
# sharing bookings over the direct transport, each taking half of an open-
# loop load (a gateway spreading requests over them), next to a pair
# sharing through NATS JetStream (a local nats-server, when installed),
# the same pair not sharing (no --peers) and one replica alone taking all
# of it, alternated in one run. Reports the propagation delay of the synced pair
# (kvpick_replica_peer_delay_seconds: a batch's send on one replica to its
# changes applied on the other) and the CPU each request costs (the
# servers' user+system time over the requests served): synced ÷ unsynced
# is what sharing costs, unsynced ÷ solo what a second process costs.
#
#   perf/replicas_serve.sh                         # 3 rounds × 10 s at 500 and 2000 req/s
#   ROUNDS=2 DURATION=5s RATES="1000" BATCH_DELAY_US=500 perf/replicas_serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
RATES=${RATES:-500 2000}
OUT=target/replicas-serve
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.cpu "$OUT"/*.prom

# shellcheck source=perf/serve_env.sh
source perf/serve_env.sh
echo "== building (release): kvpick, kvpick-load, kvpick-sim" >&2
cargo build --release -q -p kvpick-app --bin kvpick -p kvpick-perf --bin kvpick-load -p kvpick-sim --bin kvpick-sim
start_render
write_workers

# serve NAME EXT_PROC_PORT [flags...]: health at +1, metrics at +2.
serve() {
  local name=$1 port=$2
  shift 2
  ./target/release/kvpick serve --workers-file "$OUT/workers.json" --listen-address 127.0.0.1 \
    --ext-proc-port "$port" --health-port "$((port + 1))" --metrics-port "$((port + 2))" --tokenizer-url "$render" \
    --model sim-model --log warn "$@" 2>"$OUT/$name.stderr" &
  pids+=($!)
  eval "pid_$name=$!"
  wait_port "$port"
}
peers="127.0.0.1:19310,127.0.0.1:19320"
delay=${BATCH_DELAY_US:-0}
serve a 19300 --replica-sync-port 19310 --peers "$peers" --peer-token bench --peer-batch-delay-us "$delay"
serve b 19303 --replica-sync-port 19320 --peers "$peers" --peer-token bench --peer-batch-delay-us "$delay"
serve solo 19306
serve c 19330
serve d 19333
# The nats transport's pair, through a nats-server of its own.
if command -v nats-server >/dev/null; then
  rm -rf "$OUT/nats" && mkdir -p "$OUT/nats"
  nats-server -js -a 127.0.0.1 -p 19400 -sd "$OUT/nats" 2>"$OUT/nats.stderr" &
  pids+=($!)
  pid_nats=$!
  wait_port 19400
  nats=(--peer-transport nats --peer-nats-url nats://127.0.0.1:19400 --peer-nats-pool bench --peer-batch-delay-us "$delay")
  serve e 19340 --replica-sync-port 19350 "${nats[@]}"
  serve f 19343 --replica-sync-port 19360 "${nats[@]}"
else
  echo "note: no nats-server here (apt-get install nats-server): the nats transport is not measured" >&2
fi
sleep 1

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks, user + system
load() { # addr rps out
  ./target/release/kvpick-load --addr "$1" --rps "$2" -z "$DURATION" --no-progress --format json >"$3"
}

# pair_load NAME PID1 PORT1 PID2 PORT2 [BROKER_PID]: half the rate to each,
# at once; their CPU ticks before and after, then the broker's (uses $rate,
# $half, $round).
pair_load() {
  local before broker=""
  before="$(cpu "$2") $(cpu "$4")"
  [ -n "${6:-}" ] && broker=$(cpu "$6")
  load "127.0.0.1:$3" "$half" "$OUT/$1-a-$rate-$round.json" &
  local l1=$!
  load "127.0.0.1:$5" "$half" "$OUT/$1-b-$rate-$round.json" &
  local l2=$!
  wait "$l1" "$l2"
  [ -n "$broker" ] && broker="$broker $(cpu "$6")"
  echo "$before $(cpu "$2") $(cpu "$4") $broker" >"$OUT/$1-$rate-$round.cpu"
}

for rate in $RATES; do
  half=$((rate / 2))
  for round in $(seq "$ROUNDS"); do
    pair_load pair "$pid_a" 19300 "$pid_b" 19303
    before=$(cpu "$pid_solo")
    load 127.0.0.1:19306 "$rate" "$OUT/solo-$rate-$round.json"
    echo "$before $(cpu "$pid_solo")" >"$OUT/solo-$rate-$round.cpu"
    pair_load apart "$pid_c" 19330 "$pid_d" 19333
    if [ -n "${pid_e:-}" ]; then
      pair_load nats "$pid_e" 19340 "$pid_f" 19343 "$pid_nats"
    fi
    echo "rate $rate round $round done" >&2
  done
  # The delay histograms so far (each rate's are the difference).
  for name in a:19302 b:19305 ${pid_e:+e:19342 f:19345}; do
    curl -s "http://127.0.0.1:${name#*:}/metrics" >"$OUT/${name%%:*}-$rate.prom"
  done
done

python3 - "$OUT" "$ROUNDS" "$RATES" "$(getconf CLK_TCK)" <<'PY'
import json, os, re, statistics, sys
out, rounds, rates, tck = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
def served(path):
    d = json.load(open(path))
    return d["statusCodeDistribution"].get("OK", 0), d["count"]
print("| offered req/s | setup | served OK | CPU µs per request | ÷ unsynced pair | ÷ 1 replica |")
print("|---:|---|---:|---:|---:|---:|")
def pair_run(kind, rate, r, broker=False):
    c = [int(x) for x in open(f"{out}/{kind}-{rate}-{r}.cpu").read().split()]
    ticks = (c[2] - c[0]) + (c[3] - c[1]) + (c[5] - c[4] if broker and len(c) == 6 else 0)
    oka, na = served(f"{out}/{kind}-a-{rate}-{r}.json")
    okb, nb = served(f"{out}/{kind}-b-{rate}-{r}.json")
    return ticks / tck * 1e6 / max(oka + okb, 1), oka + okb, na + nb
def solo_run(rate, r):
    c = [int(x) for x in open(f"{out}/solo-{rate}-{r}.cpu").read().split()]
    ok, n = served(f"{out}/solo-{rate}-{r}.json")
    return (c[1] - c[0]) / tck * 1e6 / max(ok, 1), ok, n
for rate in rates:
    runs = {
        "2 replicas, synced (direct)": [pair_run("pair", rate, r) for r in range(1, rounds + 1)],
        "2 replicas, not synced": [pair_run("apart", rate, r) for r in range(1, rounds + 1)],
        "1 replica": [solo_run(rate, r) for r in range(1, rounds + 1)],
    }
    if os.path.exists(f"{out}/nats-{rate}-1.cpu"):
        runs["2 replicas, synced (nats)"] = [pair_run("nats", rate, r) for r in range(1, rounds + 1)]
        runs["2 replicas, synced (nats), with nats-server's CPU"] = [
            pair_run("nats", rate, r, broker=True) for r in range(1, rounds + 1)
        ]
    apart = [x[0] for x in runs["2 replicas, not synced"]]
    solo = [x[0] for x in runs["1 replica"]]
    for name, rs in runs.items():
        cpu = [x[0] for x in rs]
        ok, total = sum(x[1] for x in rs), sum(x[2] for x in rs)
        vs_apart = statistics.median([c / a for c, a in zip(cpu, apart)])
        vs_solo = statistics.median([c / s for c, s in zip(cpu, solo)])
        print(f"| {rate} | {name} | {ok}/{total} | {statistics.median(cpu):.0f} | {vs_apart:.2f}× | {vs_solo:.2f}× |")

def buckets(path):
    rows = []
    for line in open(path):
        m = re.match(r'kvpick_replica_peer_delay_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
        if m:
            rows.append((float("inf") if m[1] == "+Inf" else float(m[1]), int(m[2])))
    return rows
def quantile(rows, q):
    total = rows[-1][1]
    for bound, count in rows:
        if count >= q * total:
            return bound
print()
print("| offered req/s | receiving replica | batches measured | p50 ≤ | p90 ≤ | p99 ≤ |")
print("|---:|---|---:|---:|---:|---:|")
fmt = lambda s: "∞" if s == float("inf") else (f"{s * 1e3:g} ms" if s >= 1e-3 else f"{s * 1e6:g} µs")
# a and b: direct; e and f: nats.
for name in [n for n in ("a", "b", "e", "f") if os.path.exists(f"{out}/{n}-{rates[0]}.prom")]:
    before = None
    for rate in rates:
        rows = buckets(f"{out}/{name}-{rate}.prom")
        if before:
            rows = [(bound, count - old) for (bound, count), (_, old) in zip(rows, before)]
        before = buckets(f"{out}/{name}-{rate}.prom")
        print(f"| {rate} | {name} | {rows[-1][1]:,} | {fmt(quantile(rows, .5))} | {fmt(quantile(rows, .9))} | {fmt(quantile(rows, .99))} |")
PY
echo
echo "- --peer-batch-delay-us $delay; $ROUNDS rounds of $DURATION per rate, pair and solo alternated; medians of the rounds; delays per rate (bucket upper bounds); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%d)"
