"""Start a real `gpufleet exporter` process (simulated backend) for tests that need one on loopback."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from gpufleet.procs import terminate
from tests.realstack.process import free_port, wait_for


def start_exporter(tmp: Path, scenario: str, jobs: dict[int, str], host: str = "127.0.0.1",
                   kubelet_socket: str = "") -> tuple[subprocess.Popen, int]:
    """`gpufleet exporter` (sim backend, 1 s polls) on a free port of `host` (any 127.x.y.z is
    loopback: several "nodes" on one machine), with a Slurm job-map dir (and the kubelet
    pod-resources socket, for pods, when one is given)."""
    (tmp / "scenario.toml").write_text(scenario)
    jobmap = tmp / "jobmap"
    jobmap.mkdir()
    for gpu, job_id in jobs.items():
        (jobmap / str(gpu)).write_text(f"{job_id}\n")
    cfg = tmp / "exporter.toml"
    cfg.write_text(
        "[exporter]\npoll_interval = 1.0\nprocess_interval = 1.0\ndevice_map_file = \"\"\n"
        f"kubelet_socket = \"{kubelet_socket}\"\n"
        f"cgroup_mapping = false\njob_map_dir = \"{jobmap}\"\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(cfg), "--backend", "sim",
         "--sim-scenario", str(tmp / "scenario.toml"), "--listen", f"{host}:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "exporter.log", "wb"),
    )

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: {(tmp / 'exporter.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as r:
                return b"gpufleet_gpu_up" in r.read()
        except OSError:
            return False

    wait_for("the exporter to answer", answers, timeout=30)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    terminate(proc)
