"""A real headless Chromium loads every dashboard page from a running `gpufleet dashboard` while
`gpufleet collect` is writing the store it reads; a screenshot per page, and no Streamlit error.

The stack, all real processes on loopback: a simulated exporter (exporter/scenarios/demo-node.toml:
8 H100s, one losing itself to XID 79) with a Slurm job-mapping directory; a stand-in `sacct`
(a shell script printing accounting lines whose job names are hostile: HTML, SQL, pipes); the
collector scraping the exporter every 2 s and reading sacct; the dashboard on the collector's
store; Chromium (Debian's) driven over the DevTools protocol: open the page, wait until Streamlit
is connected and its script has finished, let charts settle, then screenshot and read the DOM.
(`--screenshot --virtual-time-budget` alone shot Streamlit's loading skeleton here: virtual time
does not wait for the websocket.)

Artifacts: test-artifacts/dashboard/<page>.png and .html (git-ignored).
Under CI=true a missing Chromium fails the test (tests/realstack/policy.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.realstack.debian import ensure_packages
from tests.realstack.policy import unavailable
from tests.realstack.process import Daemon, HarnessError, free_port, tail, wait_for
from tests.support.browser import Browser
from tests.support.dashboard import dashboard_healthy

pytestmark = pytest.mark.realstack

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
US = "\x1f"
HOSTILE = {
    "7001": '<script>alert("pwned")</script>',
    "7002": "'; DROP TABLE jobs; --",
    "7003": "a|b|c <b>bold</b> **md**",
}
PAGES = (  # (artifact name, path, the page's title)
    ("fleet_now", "/", "Fleet now"),
    ("utilization", "/utilization?by=account", "Utilization"),
    ("jobs", "/jobs?job=7001", "Jobs"),
    ("teams", "/teams", "Teams and fairness"),
    ("waste", "/waste", "Waste and cost"),
    ("health", "/health", "Health"),
    ("mfu", "/mfu", "MFU"),
    ("reliability", "/reliability", "Reliability"),
)
ERROR_MARKERS = ('data-testid="stException"', 'data-testid="stAlertContentError"', 'data-testid="stErrorElementStack"')
# each drawn chart's marks and how many have an area (an axis whose marks are all 0 px high shows nothing)
MARKS_JS = """Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')).map(svg => {
    const marks = Array.from(svg.querySelectorAll('.role-mark path, .role-mark rect, .role-mark line, .role-mark symbol'));
    return [marks.length, marks.filter(m => { const b = m.getBBox(); return b.width > 0.5 && b.height > 0.5; }).length]; })"""


def chromium_binary() -> str:
    ensure_packages("chromium")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        unavailable("Debian package chromium installed but no chromium binary on PATH")
    return path


# --- the stack ---


def fake_sacct(tmp: Path, start: datetime) -> Path:
    fmt = lambda t: t.strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731 - SLURM_TIME_FORMAT=standard
    rows = [
        # JobIDRaw JobID Cluster User Account Partition QOS Submit Eligible Start End State ExitCode NNodes NodeList AllocTRES ReqTRES JobName
        ["7001", "7001", "browser", "alice", "physics", "gpu", "normal", fmt(start - timedelta(minutes=5)), fmt(start - timedelta(minutes=5)),
         fmt(start), "Unknown", "RUNNING", "0:0", "1", "sim-h100-01", "cpu=16,gres/gpu=4,node=1", "gres/gpu=4", HOSTILE["7001"]],
        ["7002", "7002", "browser", "bob", "biology", "gpu", "normal", fmt(start - timedelta(minutes=2)), fmt(start - timedelta(minutes=2)),
         fmt(start), "Unknown", "RUNNING", "0:0", "1", "sim-h100-01", "cpu=4,gres/gpu=1,node=1", "gres/gpu=1", HOSTILE["7002"]],
        ["7003", "7003", "browser", "carol", "physics", "gpu", "normal", fmt(start - timedelta(minutes=1)), fmt(start - timedelta(minutes=1)),
         fmt(start), "Unknown", "RUNNING", "0:0", "1", "sim-h100-01", "cpu=4,gres/gpu=1,node=1", "gres/gpu=1", HOSTILE["7003"]],
    ]
    data = tmp / "sacct.txt"
    data.write_text("".join(US.join(r) + "\n" for r in rows))
    script = tmp / "fake-sacct"
    script.write_text(f"#!/bin/sh\n# stands in for sacct: prints the same accounting lines whatever it is asked\ncat '{data}'\n")
    script.chmod(0o755)
    return script


def gpufleet(*args: str) -> list[str]:
    from gpufleet.cli import SUBCOMMANDS

    if args[0] == "dashboard" and "dashboard" not in SUBCOMMANDS:
        return [sys.executable, "-m", "gpufleet.dashboards.cli", *args[1:]]  # not registered in gpufleet/cli.py yet
    return [sys.executable, "-m", "gpufleet.cli", *args]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    pytest.importorskip("streamlit")
    binary = chromium_binary()
    tmp = tmp_path_factory.mktemp("dash-browser")
    store = tmp / "store"
    jobmap = tmp / "job-mapping"
    jobmap.mkdir()
    for gpu, job in ((0, "7001"), (1, "7001"), (2, "7001"), (3, "7001"), (5, "7002"), (6, "7003")):
        (jobmap / str(gpu)).write_text(job + "\n")
    start = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)
    exporter_port, dashboard_port = free_port(), free_port()
    scenario = ROOT / "exporter" / "scenarios" / "demo-node.toml"
    cfg = tmp / "gpufleet.toml"
    cfg.write_text(f"""
[exporter]
cgroup_mapping = false
kubelet_socket = ""
device_map_file = ""

[collector]
store = "{store}"
cluster = "browser"
listen = ""

[collector.scrape]
interval = 2
targets = ["127.0.0.1:{exporter_port}"]

[collector.sacct]
enabled = true
interval = 5
command = "{fake_sacct(tmp, start)}"
initial_lookback_seconds = 86400

[dashboard]
refresh_seconds = 15
""")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    daemons = [
        Daemon("exporter", [sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(cfg), "--backend", "sim", "--sim-scenario",
                            str(scenario), "--listen", f"127.0.0.1:{exporter_port}", "--job-map-dir", str(jobmap)], tmp / "exporter.log", env=env, cwd=tmp),
        Daemon("collector", [sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg)], tmp / "collector.log", env=env, cwd=tmp),
        Daemon("dashboard", gpufleet("dashboard", "--config", str(cfg), "--listen", f"127.0.0.1:{dashboard_port}"), tmp / "dashboard.log",
               env=env, cwd=tmp),
    ]
    try:
        daemons[0].start()
        wait_for("the exporter", lambda: urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=2).status == 200,
                 timeout=60, daemons=daemons[:1])
        daemons[1].start()

        def collected() -> bool:
            from gpufleet.collector.store import open_reader

            if not (store / "manifest.json").exists():
                return False
            con = open_reader(store)
            samples = con.execute("SELECT count(DISTINCT ts) FROM gpu_samples").fetchone()[0]
            jobs = con.execute("SELECT count(*) FROM jobs").fetchone()[0]
            allocs = con.execute("SELECT count(*) FROM allocations").fetchone()[0]
            return samples >= 3 and jobs >= 3 and allocs >= 6

        wait_for("the collector to store samples, jobs and allocations", collected, timeout=120, daemons=daemons[:2])
        daemons[2].start()
        wait_for("the dashboard's /_stcore/health", lambda: dashboard_healthy(dashboard_port), timeout=90, daemons=daemons)
        yield {"url": f"http://127.0.0.1:{dashboard_port}", "daemons": daemons, "tmp": tmp, "binary": binary, "store": store}
    finally:
        for d in reversed(daemons):
            d.stop()


def test_every_page_renders_in_chromium_while_the_collector_writes(stack):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    collector = stack["daemons"][1]
    version0 = json.loads((stack["store"] / "manifest.json").read_text())["version"]
    problems, timings = [], {}
    with Browser(stack["binary"], stack["tmp"]) as browser:
        for name, path, title in PAGES:
            timings[name] = browser.load(stack["url"] + path)
            time.sleep(2.0)  # Vega charts and the data grid draw after the script finishes
            browser.screenshot(ARTIFACTS / f"{name}.png")
            dom = browser.dom()
            (ARTIFACTS / f"{name}.html").write_text(dom)
            for marker in ERROR_MARKERS:
                if marker in dom:
                    problems.append(f"{name}: {marker} in the page (see {ARTIFACTS / (name + '.html')})")
            for i, (marks, drawn) in enumerate(browser.js(MARKS_JS) or []):
                if marks and not drawn:
                    problems.append(f"{name}: chart {i + 1} has {marks} marks and none is drawn with an area (see {name}.png)")
            h1 = browser.js("document.querySelector('h1') && document.querySelector('h1').innerText")
            if (h1 or "").strip() != title:
                problems.append(f"{name}: title {h1!r}, expected {title!r}")
            if "No store to read yet" in dom or "The store cannot be read" in dom:
                problems.append(f"{name}: the dashboard did not read the collector's store")
            if name == "jobs":
                # the hostile name shown as text: escaped in the DOM, never a live element
                if "&lt;script&gt;alert(\"pwned\")&lt;/script&gt;" not in dom:
                    problems.append("jobs: the job name is not shown verbatim (escaped) in the report")
                if browser.js("Array.from(document.scripts).some(s => s.textContent.includes('pwned'))"):
                    problems.append("jobs: the job name became a <script> element")
            if name == "fleet_now":
                metrics = browser.js("""Array.from(document.querySelectorAll('[data-testid="stMetric"]')).map(m => m.innerText)""")
                if not any("Held by jobs" in m for m in metrics):
                    problems.append(f"fleet_now: metrics missing: {metrics}")
        # auto-refresh: with no reload, Fleet now follows the collector's publishes
        browser.load(stack["url"] + "/")
        # (the collector's age on Fleet now: a rerun after a publish shows a new one)
        version_js = """(() => { const m = Array.from(document.querySelectorAll('[data-testid="stMetric"]'))
            .find(e => e.innerText.startsWith('Collector last wrote')); return m ? m.innerText.split('\\n').pop() : null; })()"""
        shown = browser.js(version_js)
        try:
            wait_for("Fleet now to refresh itself", lambda: browser.js(version_js) not in (None, shown), timeout=240, interval=1.0)
        except HarnessError as e:
            problems.append(f"auto-refresh: the collector's age shown stayed {shown!r}: {e}")
    collector.check_alive()  # the single writer kept running the whole time
    # Chromium's temporary files went to the test's directory (Browser sets its TMPDIR): a browser stopped by a signal leaves
    # its process-singleton directory, which in /tmp outlived every run
    assert list(stack["tmp"].glob("org.chromium.Chromium.*")), "Chromium's temporary files are not in the test's directory"
    version1 = json.loads((stack["store"] / "manifest.json").read_text())["version"]
    log = (stack["tmp"] / "dashboard.log").read_text(errors="replace")
    for bad in ("Traceback", "IOException", "Could not set lock", "Conflicting lock"):
        if bad in log:
            problems.append(f"dashboard log has {bad!r}:\n{tail(stack['tmp'] / 'dashboard.log', 40)}")
    assert not problems, "\n".join(problems)
    assert version1 > version0, "the collector did not publish while the pages were read"
    for name, _, _ in PAGES:
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name
    print("page load (s):", {k: round(v, 2) for k, v in timings.items()})
