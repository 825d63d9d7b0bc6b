"""`gpufleet demo`, the README's main command, run whole: backfill, live exporters, collector,
dashboard, report, Ctrl-C. A file of its own: it builds its own history, so it runs beside
test_demo.py's tests of the module's store rather than after them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from datetime import timedelta

import polars as pl

from gpufleet.analytics import fleet_now as fn
from gpufleet.analytics.params import Params
from gpufleet.collector.store import open_reader
from gpufleet.report import fmt
from gpufleet.times import utcnow
from tests.realstack.process import HarnessError, free_port, wait_for
from tests.support.dashboard import dashboard_healthy


def _report_recomputes_as_printed(text: str, cwd) -> None:
    """The demo report's "Recompute:" line runs as printed and gives the report's figures (issue #13.6)."""
    line = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("Recompute: "))
    argv = shlex.split(line[len("Recompute: "):])
    assert argv[:2] == ["gpufleet", "analyze"] and "--config" in argv and "--store" in argv
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    run = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    t = got["totals"]
    headline = {ln.strip().split("  ")[0]: ln for ln in text.splitlines() if ln.startswith("  ")}
    assert fmt.hours(t["allocated_gpu_h"]) in headline["GPU-hours allocated"]
    assert fmt.usd(t["idle_allocated_cost"]) in headline["Cost of idle allocated GPUs"]
    assert got["fairness"]["shares"] == "config"  # the demo's entitled shares, from --config


def _fleet_now_on_the_live_store(root, history_end) -> None:
    """Fleet now with live scrapes after the backfilled history: 159 of 160 physical GPUs report,
    the lost GPU shows XID 79, and idle GPUs are idle since their history, not the live start."""
    seen = {}

    def counted() -> bool:  # until every exporter's first live scrape is stored (slow on a loaded machine)
        now = utcnow()
        p = Params(start=now - timedelta(days=1), end=now)
        seen["states"] = fn.gpu_states(open_reader(root), p, now)
        seen["s"] = s = fn.summarize(seen["states"], p, now)
        return (s.gpus, s.reporting, s.lost) == (160, 159, 1)

    wait_for("Fleet now: 159 of 160 GPUs reporting, 1 lost", counted, timeout=300, interval=5)
    states = seen["states"]
    assert states.filter(pl.col("status") == "lost")["last_xid"].to_list() == [79]
    idle = states.filter(pl.col("idle_allocated"))
    assert idle.height and idle.filter(pl.col("idle_since") <= history_end).height >= idle.height / 2, idle["idle_since"].to_list()


def test_demo_command_runs_the_pipeline_and_stops_on_ctrl_c(tmp_path):
    """The README's main command: backfill, live exporters, collector, dashboard, report; then
    SIGINT (what Ctrl-C sends) stops it with exit 0 and leaves no child process behind."""
    # generous deadlines, polled: the run starts the longest tests together with this one, and a
    # deadline that a loaded machine misses is a timing race, not a test
    port = free_port()
    log = tmp_path / "demo.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--no-browser", "--workdir", str(tmp_path / "w"),
         "--listen", f"127.0.0.1:{port}"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def demo_says(text: str):
        """A wait's predicate that fails at once, with the demo's output, if the demo has exited."""
        def said() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the demo exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
            return text in log.read_text()
        return said

    try:
        wait_for("the demo to print its URLs", demo_says("Ctrl-C stops the demo"), timeout=600)
        out = log.read_text()
        assert f"dashboard          http://127.0.0.1:{port}/" in out and "backfilling a week of history" in out
        wait_for("the dashboard", lambda: dashboard_healthy(port, timeout=5), timeout=300)
        store = open_reader(tmp_path / "w" / "store")
        history_end = store.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]

        def live_rows() -> bool:
            con = open_reader(tmp_path / "w" / "store")
            return con.execute("SELECT count(DISTINCT cluster) FROM gpu_samples WHERE ts > ?", [history_end]).fetchone()[0] == 2

        wait_for("the collector to store live scrapes of both clusters", live_rows, timeout=300)
        wait_for("the weekly report", demo_says("weekly report written"), timeout=600)
        reports = sorted(p.suffix for p in (tmp_path / "w" / "reports").iterdir())
        assert ".html" in reports and ".txt" in reports
        text = next((tmp_path / "w" / "reports").glob("*.txt")).read_text()
        assert "THE 10 MOST WASTEFUL JOBS" in text and "nlp" in text
        _report_recomputes_as_printed(text, tmp_path)
        _fleet_now_on_the_live_store(tmp_path / "w" / "store", history_end)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0

        def left() -> list[str]:
            return subprocess.run(["pgrep", "-f", str(tmp_path / "w")], capture_output=True, text=True).stdout.split()

        # (the demo waits for its children; a loaded machine may still be reaping them)
        try:
            wait_for("the demo's processes to be gone", lambda: left() == [], timeout=30, interval=0.25)
        except HarnessError:
            raise AssertionError(f"processes left behind: {left()}") from None
    finally:
        if proc.poll() is None:  # a failed assertion: stop it the way Ctrl-C does, so its children go too
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
