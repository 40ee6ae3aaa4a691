#!/usr/bin/env bash
# Open-loop ext_proc latency of kvpick's pick against the null picker, in
# one run (issue #24 part 2: at most +50 µs at p50 at 500, 2,000 and 5,000
# requests/s, where a shard thread sleeps between requests).
#
# Each point runs `kvpick-load --spawn KIND --rps R` for DURATION, the three
# servers interleaved, ROUNDS times; the table gives each server's median of
# the rounds' request-path p50 and p99 and kvpick's added p50 over the null
# picker. `kv`: the KvPicker over a shard thread (the default runtime);
# `kv-inline`: the same over an inline shard (no shard thread).
#
#   perf/open-loop/run.sh [ROUNDS (3)] [DURATION (5s)] [RATES ("500 2000 5000")]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
duration=${2:-5s}
rates=${3:-500 2000 5000}
cargo build --release -q -p kvpick-perf --bin kvpick-load
load=target/release/kvpick-load
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "10 % in 228.2 µs" lines → µs.
quantile() { # file, percent
  awk -v q="$2 %" '
    index($0, q " in ") == 3 || index($0, q " in ") == 2 {
      v = $(NF-1); u = $NF
      if (u == "ms") v *= 1000; else if (u == "s") v *= 1000000; else if (u == "ns") v /= 1000
      print v; exit
    }' "$1"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "| requests/s | server | p50 µs | p99 µs | added p50 over null µs |"
echo "|---:|---|---:|---:|---:|"
for rate in $rates; do
  for round in $(seq "$rounds"); do
    for kind in null kv kv-inline; do
      "$load" --spawn "$kind" --rps "$rate" -z "$duration" > "$out/$rate-$kind-$round.txt" 2>/dev/null
      if ! grep -q "ended: timeout" "$out/$rate-$kind-$round.txt"; then
        echo "kvpick-load --spawn $kind --rps $rate did not run its time" >&2
        cat "$out/$rate-$kind-$round.txt" >&2
        exit 1
      fi
    done
  done
  declare -A p50=()
  for kind in null kv kv-inline; do
    p50[$kind]=$(for r in $(seq "$rounds"); do quantile "$out/$rate-$kind-$r.txt" 50; done | median)
    p99=$(for r in $(seq "$rounds"); do quantile "$out/$rate-$kind-$r.txt" 99; done | median)
    added=$(awk -v a="${p50[$kind]}" -v b="${p50[null]}" 'BEGIN {printf "%+.1f", a - b}')
    [ "$kind" = null ] && added="—"
    printf "| %s | %s | %.1f | %.1f | %s |\n" "$rate" "$kind" "${p50[$kind]}" "$p99" "$added"
  done
done
echo
echo "- $rounds rounds of $duration per server and rate, interleaved; medians of the rounds; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%d)"
