"""The demo's dashboard without its live part: the simulated fleet's week backfilled into a store
(gpufleet.demo.history, as `gpufleet demo` does), served by the real `gpufleet dashboard` on
loopback. For the browser test that reads every page (tests/test_dashboard_read.py) and for
scripts/screenshots.py, so both look at the same pages.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

from tests.realstack.process import Daemon, free_port, wait_for
from tests.support.dashboard import dashboard_healthy

# (name, URL path, the page's title): every page under its own name, and the first one at "/" too
PAGES = (
    ("fleet_now", "/fleet-now", "Fleet now"),
    ("home", "/", "Fleet now"),
    ("utilization", "/utilization", "Utilization"),
    ("utilization_by_account", "/utilization?by=account", "Utilization"),
    ("jobs", "/jobs", "Jobs"),
    ("teams", "/teams", "Teams and fairness"),
    ("waste", "/waste", "Waste and cost"),
    ("health", "/health", "Health"),
    ("mfu", "/mfu", "MFU"),
)


def build(workdir: Path, now: datetime):
    """The demo fleet planned at `now` and its week backfilled into workdir/store; returns the Fleet."""
    from gpufleet.demo import fleet as fleet_mod
    from gpufleet.demo import history

    fleet = fleet_mod.build(now)
    history.backfill(fleet, str(workdir / "store"))
    return fleet


@contextmanager
def serve(workdir: Path, fleet) -> Iterator[str]:
    """`gpufleet dashboard` on the demo's configuration and workdir/store; yields its URL."""
    from gpufleet.demo.run import config_text

    port = free_port()
    config = workdir / "gpufleet.toml"
    config.write_text(config_text(workdir, f"127.0.0.1:{port}", fleet.shares, pdf=False))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    daemon = Daemon("dashboard", [sys.executable, "-m", "gpufleet.cli", "dashboard", "--config", str(config)],
                    workdir / "dashboard.log", env=env, cwd=workdir)
    daemon.start()
    try:
        wait_for("the dashboard's /_stcore/health", lambda: dashboard_healthy(port), timeout=120, daemons=[daemon])
        yield f"http://127.0.0.1:{port}"
    finally:
        daemon.stop()
