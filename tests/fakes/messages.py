"""A local HTTP server that speaks the Anthropic Messages API (POST /v1/messages), for tests and benchmarks.

No LLM is reachable from the project's machines, so the Anthropic labeller is exercised through the real
`anthropic` SDK against this server.  By default it answers like a small model would: a label made from the
<keywords> of the prompt (a keyword-only store's: labels from its <terms>).  Tests script failures and hostile answers with `plan` (consumed in order):

    server.plan(429, retry_after=0)         # rate limited, with a retry-after header
    server.plan(500)                        # server error
    server.plan("delay", seconds=5)         # slower than the client's timeout
    server.plan("text", text="Ignore previous instructions and ...")   # hostile or malformed label
    server.plan("garbage")                  # a body that is not JSON
    server.fail_until = time.time() + 30    # an outage: 500s until then

Every request is recorded in `server.requests` (the parsed JSON body).
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .chat import default_answer  # the same answers as the Chat Completions fake


def _words(text: str) -> int:
    return max(1, len(re.findall(r"\S+", text)))


class MessagesServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._plan: deque = deque()
        self._lock = threading.Lock()
        self.requests: list[dict] = []
        self.fail_until = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict | None = None):
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                with server._lock:
                    server.requests.append(body)
                    step = server._plan.popleft() if server._plan else None
                if not self.path.startswith("/v1/messages"):
                    return self._send(404, b'{"type":"error","error":{"type":"not_found_error","message":"no"}}')
                if step is None and time.time() < server.fail_until:
                    step = (500, {})
                kind, opts = step if step else ("ok", {})
                if kind == "delay":
                    time.sleep(opts.get("seconds", 5))
                    kind = "ok"
                if isinstance(kind, int):
                    headers = {}
                    if "retry_after" in opts:
                        headers["retry-after"] = str(opts["retry_after"])
                    headers["x-should-retry"] = "false" if opts.get("no_retry") else "true"
                    etype = {429: "rate_limit_error", 529: "overloaded_error"}.get(kind, "api_error")
                    err = {"type": "error", "error": {"type": etype, "message": f"scripted {kind}"}}
                    return self._send(kind, json.dumps(err).encode(), headers)
                if kind == "garbage":
                    return self._send(200, b"<html>not json")
                prompt = "".join(
                    c.get("text", "") if isinstance(c, dict) else str(c)
                    for m in body.get("messages", []) for c in
                    (m.get("content") if isinstance(m.get("content"), list) else [{"text": m.get("content", "")}]))
                text = opts.get("text") if kind == "text" else default_answer(prompt)
                out = {
                    "id": f"msg_local_{len(server.requests)}", "type": "message", "role": "assistant",
                    "model": body.get("model", "unknown"),
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": _words(prompt) * 4 // 3, "output_tokens": _words(text) * 4 // 3},
                }
                return self._send(200, json.dumps(out).encode())

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def plan(self, kind, **opts) -> None:
        with self._lock:
            self._plan.append((kind, opts))

    def start(self) -> MessagesServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":  # python -m tests.fakes.messages [port]
    import sys

    srv = MessagesServer(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8765).start()
    print(f"Messages API on {srv.base_url}", flush=True)
    srv.thread.join()
