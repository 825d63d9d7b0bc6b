"""scripts/screenshots: every dashboard page of the demo as `gpufleet demo` runs it - its backfilled
week and its live part (exporters scraped by the collector, so Fleet now shows the GPUs reporting) -
shot at 1,600 px wide by a headless Chromium into docs/screenshots/<page>.png, plus a job's page.
Re-run it after changing a page; the README's dashboards section shows the PNGs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from tests.realstack.process import free_port, wait_for
from tests.support.browser import Browser
from tests.support.dashboard import dashboard_healthy
from tests.support.demo_site import PAGES

WIDTH = 1600
ROOT = Path(__file__).resolve().parents[2]


def small(path: Path) -> None:
    """A page has few colours: 256 of them keep it as it looks at a third of the bytes (the PNGs are committed)."""
    from PIL import Image

    with Image.open(path) as im:
        im.convert("RGB").quantize(colors=256).save(path, optimize=True)


def live_fleet_reporting(store: Path) -> bool:
    """Has every GPU of the demo a live scrape stored (each reporting, or lost: none silent)?"""
    from gpufleet.analytics import fleet_now as fn
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import StoreError, open_reader
    from gpufleet.times import utcnow

    try:
        con = open_reader(store)
    except StoreError:
        return False
    now = utcnow()
    p = Params(start=now - timedelta(days=1), end=now)
    s = fn.summarize(fn.gpu_states(con, p, now), p, now)
    return s.gpus > 0 and s.no_data == 0


def main(argv: list[str]) -> int:
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import open_reader
    from gpufleet.times import utcnow

    out = Path(argv[0]) if argv else ROOT / "docs" / "screenshots"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        print("screenshots: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufleet-shots-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        log = workdir / "demo.out"
        print("starting `gpufleet demo` (backfill, live exporters, collector, dashboard) ...", file=sys.stderr)
        demo = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "demo", "--no-browser", "--workdir", str(workdir / "w"),
                                 "--listen", f"127.0.0.1:{port}"], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        def running(ready) -> bool:  # (a demo that exited fails at once, with what it said)
            if demo.poll() is not None:
                raise RuntimeError(f"the demo exited ({demo.returncode}):\n{log.read_text()[-3000:]}")
            return ready()

        try:
            wait_for("the demo to print its URLs", lambda: running(lambda: "Ctrl-C stops the demo" in log.read_text()), timeout=900)
            wait_for("the dashboard", lambda: running(lambda: dashboard_healthy(port, timeout=5)), timeout=300)
            store = workdir / "w" / "store"
            wait_for("every GPU's first live scrape", lambda: running(lambda: live_fleet_reporting(store)), timeout=600, interval=5)
            now = utcnow().replace(microsecond=0)
            a = Analysis(open_reader(store), Params(start=now - timedelta(days=1), end=now), now=now)
            job = a.top_wasteful_jobs(1)["job_id"][0]
            pages = [(n, p) for n, p, _ in PAGES if n != "home"] + [("job", f"/jobs?job={job}")]
            with Browser(binary, workdir, width=WIDTH) as browser:
                for name, path in pages:
                    browser.load(f"http://127.0.0.1:{port}{path}", timeout=240)
                    browser.settle()
                    browser.screenshot(out / f"{name}.png")
                    small(out / f"{name}.png")
                    print(f"{out / name}.png", file=sys.stderr)
        finally:
            if demo.poll() is None:
                demo.send_signal(signal.SIGINT)  # as Ctrl-C: the demo stops its children
                try:
                    demo.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    demo.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
