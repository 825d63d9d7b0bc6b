"""A loopback HTTP server answering from a table the test fills: path -> (status, content type, body),
or a callable of the request. A real socket and a real HTTP exchange, for sources that speak HTTP."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

Answer = tuple[int, str, bytes]


class Loopback:
    def __init__(self) -> None:
        self.routes: dict[str, Answer | Callable[[dict[str, Any]], Answer]] = {}
        self.requests: list[dict[str, Any]] = []  # method, path, query, headers, body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                parts = urlsplit(self.path)
                req = {"method": self.command, "path": parts.path, "query": parts.query,
                       "headers": dict(self.headers.items()), "body": self.rfile.read(length) if length else b""}
                outer.requests.append(req)
                route = outer.routes.get(parts.path)
                if route is None:
                    status, ctype, body = 404, "text/plain", b"not found"
                else:
                    status, ctype, body = route(req) if callable(route) else route
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "Loopback":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
