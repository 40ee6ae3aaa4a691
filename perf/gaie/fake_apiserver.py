#!/usr/bin/env python3
"""The least Kubernetes API the GAIE EPP needs in its standalone mode
(--endpoint-selector), for perf/gaie/run.sh: discovery, and the Pods of
namespace `default` as a watch-list (ADDED per pod, then the BOOKMARK that
ends the initial events), a list and a get. Logs every request to stderr.

usage: fake_apiserver.py PORT [NAME=IP ...]"""
import json, sys, time, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 16443
# pods: list of (name, ip)
PODS = [(a.split('=')[0], a.split('=')[1]) for a in (sys.argv[2:] or ["vllm-0=127.0.0.1", "vllm-1=127.0.0.2"])]
RV = "100"

def pod(name, ip):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": "uid-" + name,
                         "resourceVersion": RV, "labels": {"app": "fake-vllm"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "vllm", "image": "fake"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "conditions": [{"type": "Ready", "status": "True"}]}}

DISC = {
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:%d" % PORT}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "list", "watch"]}]},
    "/version": {"major": "1", "minor": "35", "gitVersion": "v1.35.0"},
}

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, fmt, *a):
        sys.stderr.write("APISERVER %s %s\n" % (self.command, self.path)); sys.stderr.flush()
    def send_json(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def chunk(self, obj):
        b = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n" % len(b) + b + b"\r\n"); self.wfile.flush()
    def do_GET(self):
        u = urlparse(self.path); q = parse_qs(u.query); p = u.path
        if p in DISC:
            return self.send_json(200, DISC[p])
        if p in ("/api/v1/namespaces/default/pods", "/api/v1/pods"):
            if q.get("watch", ["false"])[0] in ("true", "1"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if q.get("sendInitialEvents", ["false"])[0] == "true":
                    for n, ip in PODS:
                        self.chunk({"type": "ADDED", "object": pod(n, ip)})
                    self.chunk({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                        "metadata": {"resourceVersion": RV,
                                     "annotations": {"k8s.io/initial-events-end": "true"}}}})
                try:
                    while True:  # hold watch open; client re-watches on timeout
                        time.sleep(30)
                        self.chunk({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": RV}}})
                except Exception:
                    return
            return self.send_json(200, {"kind": "PodList", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": RV},
                                        "items": [pod(n, ip) for n, ip in PODS]})
        if p.startswith("/api/v1/namespaces/default/pods/"):
            name = p.rsplit("/", 1)[1]
            for n, ip in PODS:
                if n == name:
                    return self.send_json(200, pod(n, ip))
        self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": "NotFound", "code": 404, "message": "not found: " + p})
    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
