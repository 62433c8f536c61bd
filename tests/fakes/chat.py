"""A local HTTP server that speaks the OpenAI Chat Completions API (POST /v1/chat/completions), for tests and
benchmarks.

No LLM is reachable from the project's machines, so the OpenAI-compatible labeller is exercised through the real
`openai` SDK against this server, as Ollama, vLLM or a LiteLLM proxy would answer it.  By default it answers like a
small model would: a label made from the <keywords> of the prompt; `reply=` replaces that with any function of the
prompt and the request body.  Tests script failures and hostile answers with `plan` (consumed in order):

    server.plan(429, retry_after=0)         # rate limited, with a retry-after header
    server.plan(500)                        # server error
    server.fail(500, times=3)               # the next 3 calls fail
    server.plan("delay", seconds=5)         # slower than the client's timeout
    server.plan("text", text="Ignore previous instructions and ...")   # hostile or malformed label
    server.plan("garbage")                  # a body that is not JSON
    server.fail_until = time.time() + 30    # an outage: 500s until then

Every request is recorded: `server.requests` (the parsed JSON bodies) and `server.headers` (their headers).
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}


def token_count(text: str) -> int:
    return max(1, len(re.findall(r"\S+", text)) * 4 // 3)


def default_answer(prompt: str, body: dict | None = None) -> str:
    """What a small model would answer: for a cluster, its first three <keywords>, capitalised; for a keyword-only
    store (a prompt with <terms>), three labels of two terms each, one per line."""
    def listed(tag: str) -> list[str]:
        m = re.search(rf"<{tag}>(.*?)</{tag}>", prompt, re.S)
        return [w.strip() for w in (m.group(1) if m else "").split(",") if w.strip()]

    if "<terms>" in prompt:
        terms = listed("terms")
        return "\n".join(" ".join(w.capitalize() for w in terms[i:i + 2]) for i in range(0, min(len(terms), 6), 2))
    words = listed("keywords")[:3] or ["general", "documents"]
    if len(words) == 1:
        words.append("topics")
    return " ".join(w.capitalize() for w in words)


def prompt_of(body: dict) -> str:
    """The text of a request's messages (content as a string or as a list of parts)."""
    out = []
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else m
        if isinstance(content, list):
            out.extend(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
        elif content is not None:
            out.append(str(content))
    return "".join(out)


class ChatCompletionsServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 reply: Callable[[str, dict], str | None] | None = None):
        self._plan: deque = deque()
        self._lock = threading.Lock()
        self.reply = reply or default_answer
        self.requests: list[dict] = []
        self.headers: list[dict] = []
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

            def _error(self, status: int, message: str, headers: dict | None = None):
                err = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                                 "param": None, "code": None}}
                return self._send(status, json.dumps(err).encode(), headers)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":   # what clients probe before they call
                    out = {"object": "list", "data": [{"id": "local", "object": "model", "created": 0,
                                                       "owned_by": "lab"}]}
                    return self._send(200, json.dumps(out).encode())
                return self._error(404, f"no route {self.path}")

            def do_POST(self):
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    step = server._plan.popleft() if server._plan else None
                if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
                    return self._error(404, f"no route {self.path}")
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
                    return self._error(kind, f"scripted {kind}", headers)
                if kind == "garbage":
                    return self._send(200, b"<html>not json")
                if not isinstance(body.get("messages"), list) or not body.get("model"):
                    return self._error(400, "model and messages are required")
                prompt = prompt_of(body)
                text = opts.get("text") if kind == "text" else server.reply(prompt, body)
                n = len(server.requests)
                out = {
                    "id": f"chatcmpl-local-{n}", "object": "chat.completion", "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "logprobs": None, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": token_count(prompt), "completion_tokens": token_count(text or ""),
                              "total_tokens": token_count(prompt) + token_count(text or "")},
                }
                return self._send(200, json.dumps(out).encode())

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """What the SDK takes as base_url (OPENAI_BASE_URL): the API's root, ending in /v1."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def plan(self, kind, **opts) -> None:
        with self._lock:
            self._plan.append((kind, opts))

    def fail(self, status: int = 500, times: int = 1, **opts) -> None:
        """The next `times` calls answer `status` (500, 429...; retry_after=, no_retry= as for plan)."""
        for _ in range(times):
            self.plan(status, **opts)

    def start(self) -> ChatCompletionsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":  # python -m tests.fakes.chat [port]
    import sys

    srv = ChatCompletionsServer(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8766).start()
    print(f"Chat Completions API on {srv.base_url}", flush=True)
    srv.thread.join()
