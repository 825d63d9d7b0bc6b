"""The exporter's HTTP endpoint, with TLS and basic auth from a Prometheus web-config file.

The web-config file is the exporter-toolkit format every Prometheus exporter reads:

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_ca_file: ca.crt          # optional, with client_auth_type: RequireAndVerifyClientCert
    basic_auth_users:
      alice: $2y$10$...               # bcrypt hash, as `htpasswd -nBC 10` prints it

Reading it needs PyYAML and bcrypt (`pip install 'gpufleet[web]'`); plain HTTP needs neither.
A scrape is a memory copy of the last poll's exposition.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from gpufleet.config import ConfigError

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)


def load_web_config(path: str | Path) -> WebConfig:
    """Parse a web-config file, failing with a message that names the key and the problem."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"--web-config {path}: reading it needs PyYAML: pip install 'gpufleet[web]'") from None
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"--web-config {p}: cannot read: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--web-config {p}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--web-config {p}: expected a mapping with tls_server_config and/or basic_auth_users")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"--web-config {p}: unknown key {sorted(unknown)[0]!r}: expected tls_server_config, basic_auth_users, http_server_config")
    cfg = WebConfig()
    tls = doc.get("tls_server_config")
    if tls:
        cfg.tls = _tls_context(p, tls)
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(f"--web-config {p}: basic_auth_users: expected a mapping of user name to bcrypt hash")
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(f"--web-config {p}: basic_auth_users needs bcrypt: pip install 'gpufleet[web]'") from None
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise ConfigError(f"--web-config {p}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...), got {str(hashed)[:8]!r}...")
        cfg.users[str(user)] = hashed.encode()
    return cfg


def _tls_context(p: Path, tls: dict) -> ssl.SSLContext:
    base = p.parent
    resolve = lambda key: str((base / tls[key]).resolve()) if key in tls else None  # noqa: E731
    cert, key = resolve("cert_file"), resolve("key_file")
    if not cert or not key:
        raise ConfigError(f"--web-config {p}: tls_server_config needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"--web-config {p}: tls_server_config: cannot load cert_file/key_file: {e}") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"--web-config {p}: tls_server_config.client_auth_type = {auth!r}: expected one of {', '.join(_CLIENT_AUTH)}")
    ctx.verify_mode = _CLIENT_AUTH[auth]
    if tls.get("client_ca_file"):
        ctx.load_verify_locations(resolve("client_ca_file"))
    return ctx


class _Authenticator:
    """bcrypt is deliberately slow, so verified credentials are remembered (as exporter-toolkit does)."""

    def __init__(self, users: dict[str, bytes]):
        self.users = users
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        token = hashlib.sha256(f"{user}\0{password}".encode() + hashed).digest()
        with self._lock:
            if any(hmac.compare_digest(token, t) for t in self._ok):
                return True
        import bcrypt

        if bcrypt.checkpw(password.encode(), hashed):
            with self._lock:
                self._ok.add(token)
            return True
        return False


LANDING = b"""<html><head><title>gpufleet exporter</title></head><body><h1>gpufleet exporter</h1>
<p><a href="/metrics">Metrics</a></p></body></html>"""


def make_server(listen: str, exposition: Callable[[], bytes], web: WebConfig | None = None) -> ThreadingHTTPServer:
    """Bind (not yet serve) the HTTP(S) endpoint on HOST:PORT."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    web = web or WebConfig()
    auth = _Authenticator(web.users)
    gz_cache: list[bytes] = [b"", b""]  # [plain body, its gzip]: recompressed once per poll

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out as two writes; without TCP_NODELAY, Nagle holds a small body
        # until the client's delayed ACK (~40 ms) - every back-to-back scrape would pay it
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if not auth.check(self.headers.get("Authorization")):
                self._send(401, b"Unauthorized\n", "text/plain", {"WWW-Authenticate": 'Basic realm="gpufleet"'})
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body = exposition()
                headers = {}
                if "gzip" in (self.headers.get("Accept-Encoding") or ""):
                    plain, packed = gz_cache
                    if plain is not body:
                        packed = gzip.compress(body, compresslevel=1)
                        gz_cache[:] = [body, packed]
                    body, headers = packed, {"Content-Encoding": "gzip"}
                self._send(200, body, CONTENT_TYPE, headers)
            elif path in ("/", "/index.html"):
                self._send(200, LANDING, "text/html; charset=utf-8")
            elif path in ("/-/healthy", "/-/ready"):
                self._send(200, b"OK\n", "text/plain")
            else:
                self._send(404, b"Not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("%s - %s", self.address_string(), fmt % args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

        def get_request(self):  # type: ignore[override]
            sock, addr = super().get_request()
            if web.tls is not None:
                sock = web.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            return sock, addr

        def handle_error(self, request, client_address) -> None:  # noqa: ANN001
            log.debug("request from %s failed", client_address, exc_info=True)

    if ":" in host:
        Server.address_family = socket.AF_INET6
    return Server((host, int(port)), Handler)
