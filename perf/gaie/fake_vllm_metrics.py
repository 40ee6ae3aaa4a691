#!/usr/bin/env python3
"""Stand-in vLLM model servers for the GAIE EPP side-by-side (perf/gaie/run.sh):
/metrics with the vLLM metric names the EPP scrapes (every 50 ms per endpoint)
and a trivial /v1/completions, on every port given, from one process.

usage: fake_vllm_metrics.py HOST PORT[,PORT...] [WAITING] [KV_USAGE]"""
import sys, json
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
HOST, PORTS = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
WAITING = sys.argv[3] if len(sys.argv) > 3 else "0"
KV = sys.argv[4] if len(sys.argv) > 4 else "0.1"
METRICS = f"""# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {WAITING}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {KV}
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""}} 1.7e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="1000"}} 1
""".encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        b = METRICS if self.path.startswith("/metrics") else b"ok"
        self.send_response(200); self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        b = json.dumps({"id": "x", "model": "m", "choices": [{"text": "hi"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
import threading
servers = [ThreadingHTTPServer((HOST, port), H) for port in PORTS]
for server in servers[1:]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
servers[0].serve_forever()
