"""`gpufleet dashboard`: serve the Streamlit dashboards (dashboards/app.py) over a store.

Runs `python -m streamlit run dashboards/app.py --server.address HOST --server.port PORT
--server.headless true ... -- --config F --store DIR` as a child process, prints where it is,
and stops it on SIGINT/SIGTERM. With [dashboard.auth] configured, the OIDC settings go to
Streamlit in a secrets file only this user can read, created for the run and removed after.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from gpufleet.config import ConfigError, host_port
from gpufleet.procs import terminate

log = logging.getLogger(__name__)

APP = Path(__file__).resolve().parent / "app.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([dashboard], [analytics] and [collector] sections)")
    p.add_argument("--listen", help="HOST:PORT to serve on (default [dashboard] listen, else 127.0.0.1:8501; port 0 picks a free one)")
    p.add_argument("--store", help="store directory (default: [dashboard] store, [analytics] store, else [collector] store)")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise ConfigError(f"[dashboard.auth]: value {v!r} of type {type(v).__name__} cannot be passed to Streamlit")


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def secrets_toml(auth: dict[str, Any]) -> str:
    """Streamlit's secrets.toml with [auth] (and [auth.<provider>] sub-tables) from [dashboard.auth]."""
    lines = ["[auth]"]
    subs = {k: v for k, v in auth.items() if isinstance(v, dict) and k != "client_kwargs"}
    for k, v in auth.items():
        if k not in subs:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for name, table in subs.items():
        lines.append(f"\n[auth.{_toml_key(name)}]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def command(host: str, port: int, config: str | None, store: str | None, secrets: Path | None, base_url_path: str = "") -> list[str]:
    # Streamlit's command line in a process that imports the pages' code before it listens (serve.py)
    argv = [sys.executable, "-m", "gpufleet.dashboards.serve", "run", str(APP),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none", "--server.runOnSave", "false",
            "--client.toolbarMode", "viewer", "--global.showWarningOnDirectExecution", "false"]
    if secrets is not None:
        argv += ["--secrets.files", str(secrets)]
    if base_url_path.strip("/"):
        argv += ["--server.baseUrlPath", base_url_path.strip("/")]
    argv += ["--", "--served"]
    if config:
        argv += ["--config", str(Path(config).resolve())]
    if store:
        argv += ["--store", str(Path(store).resolve())]
    return argv


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from gpufleet.dashboards import config as dconfig

    out = out or sys.stdout
    try:
        if args.listen is not None and not host_port(args.listen):
            raise ConfigError(f"--listen {args.listen!r}: expected HOST:PORT")
        settings = dconfig.resolve(args.config, args.store)
        listen = args.listen or settings.dashboard["listen"]
        host, _, port_text = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        if settings.auth_enabled:
            from streamlit.auth_util import is_authlib_installed

            if not is_authlib_installed():
                raise ConfigError("[dashboard.auth] is set but Authlib is not installed: pip install 'Authlib>=1.3.2' (or streamlit[auth])")
    except ConfigError as e:
        log.error("%s", e)
        return 2
    try:
        import streamlit  # noqa: F401
    except ImportError:
        log.error("streamlit is not installed: pip install 'gpufleet[dashboards]'")
        return 1
    port = int(port_text) or _free_port(host)
    tmp = tempfile.TemporaryDirectory(prefix="gpufleet-dashboard-")
    secrets = None
    if settings.auth_enabled:
        secrets = Path(tmp.name) / "secrets.toml"
        fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets_toml(settings.dashboard["auth"]))
    base = settings.dashboard["base_url_path"].strip("/")
    argv = command(host, port, args.config, str(settings.store), secrets, base)
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, cwd=tmp.name)
    except OSError as e:
        tmp.cleanup()
        log.error("cannot start streamlit: %s", e)
        return 1
    stop = {"signal": None}

    def forward(signum: int, _frame: Any) -> None:
        stop["signal"] = signum
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    out.write(f"gpufleet dashboard: serving at http://{shown}:{port}/{base + '/' if base else ''} (store {settings.store}); Ctrl-C stops it\n")
    out.flush()
    try:
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:
                forward(signal.SIGINT, None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        terminate(child)
        tmp.cleanup()
    if stop["signal"] is not None:
        return 0
    if rc != 0:
        log.error("streamlit exited with status %s", rc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m gpufleet.dashboards.cli`: the same as `gpufleet dashboard`."""
    p = argparse.ArgumentParser(prog="gpufleet dashboard", description="serve the Streamlit dashboards")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return run(args, out=sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
