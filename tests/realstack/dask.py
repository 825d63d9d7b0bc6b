"""A real Dask distributed cluster on loopback: `dask scheduler` and `dask worker` processes,
each a daemon of ours (tests/realstack/process.py), from the same Python as the tests, so the
workers import this checkout's gpufleet."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.realstack.process import Daemon, base_env, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]  # the checkout: workers import tests.support tasks from it


def _env() -> dict[str, str]:
    return base_env({"PYTHONPATH": str(ROOT)})


class DaskCluster:
    def __init__(self, workdir: Path, port: int, scheduler: Daemon) -> None:
        self.workdir, self.port, self.scheduler = workdir, port, scheduler
        self.workers: list[Daemon] = []

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def add_worker(self, timeout: float = 60) -> Daemon:
        n = len(self.workers)
        argv = [sys.executable, "-m", "dask", "worker", self.address, "--host", "127.0.0.1", "--nworkers", "1",
                "--nthreads", "1", "--no-dashboard", "--no-nanny", "--local-directory", str(self.workdir / f"worker-{n}"),
                "--name", f"w{n}"]
        worker = Daemon(f"dask-worker-{n}", argv, self.workdir / f"worker-{n}.log", env=_env(), cwd=self.workdir).start()
        self.workers.append(worker)
        wait_for(f"dask worker {n} to join", lambda: f"w{n}" in self.worker_names(), timeout=timeout,
                 daemons=[self.scheduler, worker], interval=0.3)
        return worker

    def worker_names(self) -> set[str]:
        from distributed import Client

        with Client(self.address, timeout=10, set_as_default=False) as c:
            return {str(w.get("name")) for w in c.scheduler_info()["workers"].values()}

    def stop(self) -> None:
        for w in self.workers:
            w.stop(timeout=10)
        self.scheduler.stop(timeout=10)


def start_dask(workdir: Path, workers: int = 2, timeout: float = 60) -> DaskCluster:
    """A scheduler on a free loopback port and `workers` single-threaded workers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
    scheduler = Daemon("dask-scheduler", argv, workdir / "scheduler.log", env=_env(), cwd=workdir).start()
    cluster = DaskCluster(workdir, port, scheduler)
    try:
        wait_for("the dask scheduler to answer", lambda: cluster.worker_names() is not None, timeout=timeout, daemons=[scheduler], interval=0.3)
        for _ in range(workers):
            cluster.add_worker(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
