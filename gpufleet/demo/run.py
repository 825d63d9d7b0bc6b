"""`gpufleet demo`: the whole pipeline on a simulated fleet, with no GPU and no root.

1. Plans the fleet (fleet.py) and backfills its last week into a fresh store (history.py).
2. Starts one real exporter per simulated node on loopback, driven by the plan (live.py).
3. Runs the collector service on them: scraping both clusters, the scheduler's accounting
   (scheduler.py), store upkeep, its own /metrics.
4. Serves the operator dashboard (`gpufleet dashboard`) and writes the weekly report for the
   backfilled week (`gpufleet report`), both as the real commands in child processes.
Prints where to look, and stops everything cleanly on Ctrl-C (or after --duration seconds).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import webbrowser
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from gpufleet.config import ConfigError, host_port
from gpufleet.procs import child_env, terminate
from gpufleet.times import utcnow

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:8501", help="HOST:PORT for the dashboard (default 127.0.0.1:8501)")
    p.add_argument("--no-browser", action="store_true", help="do not open the dashboard in a browser")
    p.add_argument("--workdir", default=str(Path.home() / ".cache" / "gpufleet" / "demo"),
                   help="where the demo keeps its store, report and node files (emptied at start)")
    p.add_argument("--seed", type=int, default=7, help="seed of the simulated workload (default 7)")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: run until Ctrl-C)")


def config_text(workdir: Path, listen: str, shares: dict[str, float], pdf: bool) -> str:
    """The one TOML file every component of the demo reads."""
    share_items = ", ".join(f'"{k}" = {v:g}' for k, v in sorted(shares.items()))
    return f"""# written by `gpufleet demo`
[collector]
store = "{workdir / 'store'}"
listen = ""

[analytics]
shares = {{ {share_items} }}

[dashboard]
listen = "{listen}"
refresh_seconds = 30
default_window = "24h"

[report]
out_dir = "{workdir / 'reports'}"
pdf = {'true' if pdf else 'false'}

[policy]
enforce = false                  # the idle-GPU policy plans only: the Jobs page, `gpufleet policy`
email_domain = "example.org"
squeue = ""                      # the simulated Slurm has no squeue to read opt-out tags from
"""


def _child(argv: list[str], log_path: Path) -> subprocess.Popen:
    """A gpufleet command in its own process group, so Ctrl-C reaches it only through us; it
    stops when we die, even by SIGKILL (child_env)."""
    return subprocess.Popen([sys.executable, "-m", "gpufleet.cli", *argv], stdout=open(log_path, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=child_env())


def _stop_child(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        terminate(proc, timeout=15)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if not host_port(args.listen):
        log.error("--listen %r: expected HOST:PORT", args.listen)
        return 2
    from gpufleet.collector.backfill import progress_bar
    from gpufleet.demo import fleet as fleet_mod
    from gpufleet.demo import history

    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC's C core logs every kubelet channel closing
    for noisy in ("httpx", "apscheduler", "gpufleet.collector.store", "gpufleet.collector.maintenance", "gpufleet.exporter.poller"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # one line per scrape, job run, migration
    workdir = Path(args.workdir).expanduser()
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "logs").mkdir(parents=True)
    now = utcnow()
    fleet = fleet_mod.build(now, seed=args.seed)
    slurm_gpus = sum(n.gpus for n in fleet.nodes if n.cluster == "hpc")
    k8s_gpus = sum(n.gpus for n in fleet.nodes if n.cluster == "k8s")
    out.write(f"gpufleet demo: simulated fleet of {len(fleet.nodes)} nodes - Slurm cluster 'hpc' ({slurm_gpus} x H100), "
              f"Kubernetes cluster 'k8s' ({k8s_gpus} x A100, some split into MIG slices); {len(fleet.jobs):,} jobs planned\n")
    started = time.monotonic()
    counts = history.backfill(fleet, str(workdir / "store"),
                              lambda done, total: (out.write(progress_bar(done, total, "backfilling a week of history", started)), out.flush()))
    out.write(f"\n  stored {counts['samples']:,} device-samples and {counts['jobs']:,} jobs in {time.monotonic() - started:.0f} s\n")
    config = workdir / "gpufleet.toml"
    config.write_text(config_text(workdir, args.listen, fleet.shares, pdf=shutil.which("chromium") is not None))
    return _serve(args, fleet, workdir, config, out)


def _serve(args: argparse.Namespace, fleet, workdir: Path, config: Path, out: TextIO) -> int:
    from prometheus_client import start_http_server

    from gpufleet.collector.service import Collector, ScheduledSource
    from gpufleet.collector.sources.scrape import ScrapeSource
    from gpufleet.collector.store import StoreWriter
    from gpufleet.demo.live import LiveFleet
    from gpufleet.demo.scheduler import SimSchedulerSource

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    live = LiveFleet(fleet, workdir)
    dashboard = report = None
    collector_thread = None
    try:
        caught = catch_up(fleet, workdir / "store")
        out.write(f"  caught up the {caught.total_seconds():.0f} s since the history's end (no gap before the live scrapes)\n")
        live.start()
        sources = [ScheduledSource(ScrapeSource(cluster=c, static_targets=live.urls(c), timeout=5.0, name=f"scrape-{c}"), 15.0)
                   for c in ("hpc", "k8s")]
        sources.append(ScheduledSource(SimSchedulerSource(fleet, fleet.now), 30.0))
        collector = Collector(StoreWriter(workdir / "store"), sources)
        metrics_server, _ = start_http_server(0, addr="127.0.0.1", registry=collector.metrics.registry)
        collector_thread = threading.Thread(target=collector.serve, args=(stop,), kwargs={"maintenance_interval": 300.0},
                                            name="collector", daemon=True)
        collector_thread.start()
        dashboard = _child(["dashboard", "--config", str(config)], workdir / "logs" / "dashboard.log")
        report = _child(["report", "--config", str(config), "--from", fleet.start.isoformat(),
                         "--to", settled_end(fleet.start, fleet.now).isoformat(), "--out", str(workdir / "reports")],
                        workdir / "logs" / "report.log")
        host, port = args.listen.rsplit(":", 1)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"
        exporters = live.urls("hpc")[:1] + live.urls("k8s")[:1]
        out.write(
            f"\n  dashboard          {url}\n"
            f"  exporters          {len(live.nodes)} on loopback, e.g. {exporters[0]} and {exporters[1]}\n"
            f"  collector metrics  http://127.0.0.1:{metrics_server.server_port}/metrics (scraping every 15 s)\n"
            f"  weekly report      {workdir / 'reports'} (being written; its log: {workdir / 'logs' / 'report.log'})\n"
            f"  configuration      {config}\n\n"
            "Ctrl-C stops the demo.\n"
        )
        out.flush()
        if not args.no_browser and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"):
            threading.Timer(5.0, webbrowser.open, args=[url]).start()
        deadline = time.monotonic() + args.duration if args.duration else None
        report_announced = False
        while not stop.wait(1.0):
            if not report_announced and report.poll() is not None:
                report_announced = True
                _announce_report(report.returncode, workdir, out)
            if dashboard.poll() is not None:
                log.error("the dashboard exited (%s); see %s", dashboard.returncode, workdir / "logs" / "dashboard.log")
                return 1
            if deadline and time.monotonic() >= deadline:
                break
        out.write("stopping the demo...\n")
        return 0
    except (ConfigError, OSError) as e:
        log.error("%s", e)
        return 1
    finally:
        stop.set()
        _stop_child(dashboard)
        _stop_child(report)
        if collector_thread:
            collector_thread.join(timeout=30)
        live.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def settled_end(history_start, history_end):
    """The latest end the weekly report can have whose figures no later sample changes: an idle
    stretch crossing the window's end counts once it lasts idle_min_duration (and a sample stands
    for up to max_gap), so a report ending nearer the history's end than that would differ from the
    same command run a minute later, once the live scrapes have extended those stretches."""
    from gpufleet.analytics.params import Params

    p = Params(start=history_start, end=history_end)
    return history_end - p.idle_min_duration - p.max_gap


CAUGHT_UP = timedelta(seconds=5)  # the live exporters start when the stored history is this close to now


def catch_up(fleet, store: Path, clock=utcnow) -> timedelta:
    """Store the scrapes since the history's end (fleet.now) until it is within CAUGHT_UP of now
    (history.catch_up, a few rounds: each one takes a moment of its own), so the collector's first
    live scrape follows the history within max_gap; how much was caught up."""
    from gpufleet.demo import history

    since = fleet.now
    for _ in range(10):
        until = clock().replace(microsecond=0)
        if until - since < CAUGHT_UP:
            break
        history.catch_up(fleet, str(store), since, until)
        since = until
    return since - fleet.now


def _announce_report(code: int, workdir: Path, out: TextIO) -> None:
    files = sorted((workdir / "reports").glob("*")) if (workdir / "reports").exists() else []
    if code == 0 and files:
        out.write("weekly report written: " + ", ".join(str(f) for f in files) + "\n")
    else:
        out.write(f"the weekly report failed (exit {code}); see {workdir / 'logs' / 'report.log'}\n")
    out.flush()
