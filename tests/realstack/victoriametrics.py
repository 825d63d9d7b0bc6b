"""VictoriaMetrics single-node (Debian package victoria-metrics) on 127.0.0.1: a real
Prometheus-compatible long-term store for the collector's Prometheus-API source.

Each instance has its own port and storage directory under the caller's workdir. Samples go in
through its Prometheus text import (/api/v1/import/prometheus, a timestamp and extra labels per
body) and are made searchable at once with /internal/force_flush (VictoriaMetrics otherwise
buffers them for about a second).
"""

from __future__ import annotations

import urllib.error
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.realstack.debian import ensure_packages, which
from tests.realstack.process import Daemon, HarnessError, base_env, free_port, wait_for
from tests.realstack.prometheus import Prometheus, _http, _start


def victoriametrics_path() -> str:
    ensure_packages("victoria-metrics")
    path = which("victoria-metrics") or which("victoria-metrics-prod")
    if not path:
        raise HarnessError("package victoria-metrics is installed but victoria-metrics is not on PATH")
    return path


class VictoriaMetrics(Prometheus):
    """The Prometheus query API (query, query_range, wait_query) plus import and flush."""

    READY_PATH = "/health"

    def version(self) -> str:
        """The Debian package's version (the binary of 1.79 prints none, its /metrics has none)."""
        from tests.realstack.process import run

        return run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"]).stdout.strip()

    def import_prometheus(self, text: str, *, timestamp_ms: int | None = None, extra_labels: dict[str, str] | None = None) -> None:
        params: list[tuple[str, Any]] = [("extra_label", f"{k}={v}") for k, v in (extra_labels or {}).items()]
        if timestamp_ms is not None:
            params.append(("timestamp", timestamp_ms))
        query = urllib.parse.urlencode(params)
        status, body = _http("POST", f"{self.url}/api/v1/import/prometheus?{query}", data=text.encode())
        if status not in (200, 204):
            raise HarnessError(f"VictoriaMetrics import -> HTTP {status}: {body[:500]!r}")

    def flush(self) -> None:
        status, body = _http("GET", f"{self.url}/internal/force_flush")
        if status != 200:
            raise HarnessError(f"VictoriaMetrics force_flush -> HTTP {status}: {body[:300]!r}")

def start_victoriametrics(workdir: Path | str, *, timeout: float = 30, extra_args: Sequence[str] = ()) -> VictoriaMetrics:
    """Start VictoriaMetrics on 127.0.0.1 with its data under `workdir`, keeping samples of any
    age (100 years), answering for samples up to now (no latency offset); wait for /health.
    Started again on the same `workdir`, it serves what it stored before."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [victoriametrics_path(), f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN", *extra_args]
    return _start(VictoriaMetrics, "victoria-metrics", argv, workdir, port, timeout)


class VmAgent:
    """vmagent (same package): scrapes targets every second and remote-writes to VictoriaMetrics."""

    def __init__(self, daemon: Daemon, port: int) -> None:
        self.daemon, self.port, self.url = daemon, port, f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.daemon.stop()


def start_vmagent(workdir: Path | str, vm: VictoriaMetrics, targets: list[str], *, timeout: float = 30) -> VmAgent:
    """vmagent on 127.0.0.1 scraping `targets` (host:port, /metrics) every second into `vm`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ensure_packages("victoria-metrics")
    binary = which("vmagent")
    if not binary:
        raise HarnessError("package victoria-metrics is installed but vmagent is not on PATH")
    config = workdir / "scrape.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpu\n    static_configs:\n"
                      "      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]\n")
    port = free_port()
    argv = [binary, f"-promscrape.config={config}", f"-remoteWrite.url={vm.url}/api/v1/write", "-remoteWrite.flushInterval=1s",
            f"-remoteWrite.tmpDataPath={workdir / 'tmp'}", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"]
    daemon = Daemon("vmagent", argv, workdir / "vmagent.log", env=base_env(), cwd=workdir).start()
    agent = VmAgent(daemon, port)

    def ready() -> bool:
        try:
            return _http("GET", f"{agent.url}/health")[0] == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    try:
        wait_for(f"vmagent /health on {agent.url}", ready, timeout=timeout, daemons=[daemon])
    except BaseException:
        agent.stop()
        raise
    return agent
