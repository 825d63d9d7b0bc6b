"""Prometheus and Alertmanager (Debian packages) on 127.0.0.1, plus promtool and amtool.

Each instance gets its own port, config file and storage directory under the caller's workdir,
so tests never share state and never touch a system Prometheus. HTTP goes through urllib: the
harness needs nothing beyond the standard library and pytest.

Timing seen with Prometheus 2.42: /-/ready answers ~0.1 s after start, but the first scrape
comes ~5 s later whatever the scrape_interval (the scrape manager applies new targets on a 5 s
tick), so a test waiting for a scraped series should use wait_query() with a timeout, not sleep.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.realstack.debian import ensure_packages, which
from tests.realstack.process import Daemon, HarnessError, base_env, free_port, wait_for

__all__ = [
    "Alertmanager",
    "Prometheus",
    "alertmanager_path",
    "amtool_path",
    "free_port",
    "prometheus_path",
    "promtool_path",
    "start_alertmanager",
    "start_prometheus",
]

log = logging.getLogger(__name__)

# Scrapes itself every second: enough for a test to see `up` within a couple of seconds.
SELF_SCRAPE_CONFIG = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ['{address}']
"""

NULL_ALERTMANAGER_CONFIG = """\
route:
  receiver: 'null'
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: 'null'
"""


def _require(package: str, binary: str) -> str:
    ensure_packages(package)
    path = which(binary)
    if not path:
        raise HarnessError(f"Debian package {package} is installed but {binary} is not on PATH")
    return path


def prometheus_path() -> str:
    return _require("prometheus", "prometheus")


def promtool_path() -> str:
    return _require("prometheus", "promtool")


def alertmanager_path() -> str:
    """Debian ships the daemon as prometheus-alertmanager; other builds call it alertmanager."""
    ensure_packages("prometheus-alertmanager")
    path = which("prometheus-alertmanager") or which("alertmanager")
    if not path:
        raise HarnessError("package prometheus-alertmanager is installed but its daemon is not on PATH")
    return path


def amtool_path() -> str:
    return _require("prometheus-alertmanager", "amtool")


def _http(method: str, url: str, data: bytes | None = None, timeout: float = 10) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class _Server:
    """What Prometheus and Alertmanager handles share: a daemon, a URL, readiness, stop."""

    READY_PATH = "/-/ready"  # answers 200 once the server serves

    def __init__(self, daemon: Daemon, port: int, workdir: Path) -> None:
        self.daemon = daemon
        self.port = port
        self.workdir = workdir
        self.address = f"127.0.0.1:{port}"
        self.url = f"http://{self.address}"

    def get(self, path: str, params: dict[str, Any] | None = None) -> tuple[int, bytes]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return _http("GET", f"{self.url}{path}{query}")

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        status, body = self.get(path, params)
        if status != 200:
            raise HarnessError(f"GET {path} -> HTTP {status}: {body[:500]!r}")
        return json.loads(body)

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            try:
                return self.get(self.READY_PATH)[0] == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        waited = wait_for(f"{self.daemon.name} {self.READY_PATH} on {self.url}", ready, timeout=timeout, daemons=[self.daemon])
        log.info("%s ready on %s after %.1fs", self.daemon.name, self.url, waited)

    def stop(self) -> None:
        self.daemon.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Prometheus(_Server):
    def query(self, promql: str, time: float | str | None = None) -> list[dict[str, Any]]:
        """Instant query; the `result` list (vector: [{'metric': {...}, 'value': [t, 'v']}, ...]).

        A scalar or string result comes back as a one-element list holding the [t, 'v'] pair.
        """
        params: dict[str, Any] = {"query": promql}
        if time is not None:
            params["time"] = time
        return self._api("/api/v1/query", params)

    def query_range(self, promql: str, start: float | str, end: float | str, step: float | str) -> list[dict[str, Any]]:
        return self._api("/api/v1/query_range", {"query": promql, "start": start, "end": end, "step": step})

    def _api(self, path: str, params: dict[str, Any]) -> list[Any]:
        status, body = self.get(path, params)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise HarnessError(f"{path} -> HTTP {status}, not JSON: {body[:300]!r}") from exc
        if doc.get("status") != "success":
            raise HarnessError(f"{path} {params} -> {doc.get('errorType')}: {doc.get('error')}")
        data = doc["data"]
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]]
        return data["result"]

    def wait_query(self, promql: str, *, timeout: float = 30, min_results: int = 1) -> list[dict[str, Any]]:
        """Poll an instant query until it returns at least `min_results` series."""
        result: list[dict[str, Any]] = []

        def enough() -> bool:
            nonlocal result
            result = self.query(promql)
            return len(result) >= min_results

        wait_for(f"{promql!r} to return {min_results}+ series", enough, timeout=timeout, daemons=[self.daemon], interval=0.25)
        return result

    def wait_scraped_past(self, job: str, when: float, *, targets: int = 1, timeout: float = 60) -> None:
        """Poll until each of `targets` targets of scrape job `job` has a scrape stamped after `when`
        (Unix seconds): a scrape's samples are appended with its `up`, so what the targets published
        up to `when` is then queryable. A loaded machine's late scrape is waited for, not missed."""

        def past() -> bool:
            stamps = [float(x["value"][1]) for x in self.query(f'timestamp(up{{job="{job}"}})')]
            return len(stamps) >= targets and min(stamps) > when

        wait_for(f"{targets} target(s) of {job!r} scraped after {when:.3f}", past, timeout=timeout, daemons=[self.daemon], interval=0.25)

    def reload(self) -> None:
        """POST /-/reload (enabled by --web.enable-lifecycle) after rewriting the config or rules."""
        status, body = _http("POST", f"{self.url}/-/reload", data=b"")
        if status != 200:
            raise HarnessError(f"Prometheus reload -> HTTP {status}: {body[:500]!r}")

    def rules(self) -> list[dict[str, Any]]:
        return self.get_json("/api/v1/rules")["data"]["groups"]

    def alerts(self) -> list[dict[str, Any]]:
        return self.get_json("/api/v1/alerts")["data"]["alerts"]


class Alertmanager(_Server):
    def alerts(self) -> list[dict[str, Any]]:
        return self.get_json("/api/v2/alerts")

    def post_alerts(self, alerts: Sequence[dict[str, Any]]) -> None:
        status, body = _http("POST", f"{self.url}/api/v2/alerts", data=json.dumps(list(alerts)).encode())
        if status != 200:
            raise HarnessError(f"POST /api/v2/alerts -> HTTP {status}: {body[:500]!r}")


def start_prometheus(
    workdir: Path | str,
    config_text: str | None = None,
    rule_files: Iterable[Path | str] = (),
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30,
) -> Prometheus:
    """Start Prometheus on 127.0.0.1 with `config_text` as prometheus.yml; wait for /-/ready.

    config_text None -> a config that scrapes this Prometheus itself every second. The text may
    contain `{address}`, replaced by this instance's 127.0.0.1:PORT (pass `port` to know it in
    advance). `rule_files` are added as a `rule_files:` section unless the config has one.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    binary = prometheus_path()
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    text = (config_text if config_text is not None else SELF_SCRAPE_CONFIG).replace("{address}", address)
    rules = [str(Path(r).resolve()) for r in rule_files]
    if rules and "rule_files:" not in text:
        text = text.rstrip("\n") + "\nrule_files:\n" + "".join(f"  - '{r}'\n" for r in rules)
    config = workdir / "prometheus.yml"
    config.write_text(text)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={address}",
        "--web.enable-lifecycle",
        *extra_args,
    ]
    return _start(Prometheus, "prometheus", argv, workdir, port, timeout)


def _start(cls, name: str, argv: list[str], workdir: Path, port: int, timeout: float):
    """Start the daemon, wait until it answers /-/ready, and stop it again if it never does."""
    daemon = Daemon(name, argv, workdir / f"{name}.log", env=base_env(), cwd=workdir).start()
    server = cls(daemon, port, workdir)
    try:
        server._wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


def start_alertmanager(
    workdir: Path | str,
    config_text: str | None = None,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30,
) -> Alertmanager:
    """Start Alertmanager on 127.0.0.1 with gossip disabled (empty --cluster.listen-address)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    binary = alertmanager_path()
    port = port or free_port()
    config = workdir / "alertmanager.yml"
    config.write_text(config_text if config_text is not None else NULL_ALERTMANAGER_CONFIG)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        *extra_args,
    ]
    return _start(Alertmanager, "alertmanager", argv, workdir, port, timeout)
