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
