"""The simulated fleet, live: one real gpufleet exporter per node, on loopback, driven by the plan.

Each node runs the product's exporter (simulated backend, poller, HTTP server) in this process.
A driver thread plays the workload and the schedulers: every few seconds it evaluates load.py
for every device at the current time and writes what it finds where real nodes would have it -
the simulator's control files (utilization, processes, tensor activity), the Slurm prolog's job
mapping files for `hpc` nodes, and the kubelet pod-resources answer for `k8s` nodes. The Slurm
training jobs that report checkpoints (demo/checkpoints.py) say so through the real job API
(gpufleet.exporter.jobreport.checkpoint_saved), from their first GPU's node, into the job-report
directory that node's exporter reads. The GPU that fell off the bus during the backfilled week
stays lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from gpufleet.exporter.backends import sim, sim_scenario
from gpufleet.exporter.jobmap.kubelet import KubeletPodResourcesSource
from gpufleet.exporter.jobmap.slurm_dir import SlurmMappingDirSource
from gpufleet.exporter.jobreport import checkpoint_saved
from gpufleet.exporter.jobreports import JobReportSource
from gpufleet.exporter.poller import Poller
from gpufleet.exporter.web import make_server
from gpufleet.demo import checkpoints, load
from gpufleet.demo.fleet import PROFILE_CODE, Fleet, Job, Node, Slot, node_slots
from gpufleet.demo.history import EPOCH, epoch

log = logging.getLogger(__name__)


class NodeRuntime:
    """One simulated node: its exporter, and the files and sockets the driver writes."""

    def __init__(self, node: Node, root: Path, sockets: Path, lost_gpu: int | None):
        self.node = node
        self.control = root / "control"
        self.jobmap = root / "jobmap"
        self.job_reports = root / "job-reports"  # what the node's jobs report (exporter/jobreport.py writes it)
        for d in (self.control, self.jobmap, self.job_reports):
            d.mkdir(parents=True, exist_ok=True)
        self.kubelet = None
        sources = []
        if node.cluster == "hpc":
            sources.append(SlurmMappingDirSource(self.jobmap))
        else:
            from gpufleet.demo.kubelet import PodResourcesServer

            sock = str(sockets / f"{node.host}.sock")
            self.kubelet = PodResourcesServer(sock)
            sources.append(KubeletPodResourcesSource(sock, timeout=2.0))
        gpus = []
        for g in range(node.gpus):
            spec: dict = {"index": g}
            if g in node.mig:
                spec["mig"] = list(node.mig[g])
            if g == lost_gpu:
                spec.update(lost_at_s=0, xid=[{"at_s": 0, "code": 79}])
            gpus.append(spec)
        # Profiling fields: the hpc H100s give them through GPM (the scenario's default for the
        # model); the k8s A100s have no GPM, so there they are what dcgm-exporter would publish.
        profiling = {} if node.cluster == "hpc" else {"profiling": "dcgm"}
        scenario = sim_scenario.parse({"hostname": node.host, "model": node.model, "gpus": node.gpus,
                                       "control_dir": str(self.control), "gpu": gpus, **profiling}, f"demo node {node.host}")
        self.poller = Poller(sim.SimBackend(scenario), sources, hostname=node.host, poll_interval=5.0,
                             process_interval=5.0, device_map_file=None, job_reports=JobReportSource(self.job_reports))
        self.server = make_server("127.0.0.1:0", self.poller.exposition, None)
        self._serving = False  # (shutdown() waits for a serve loop: one never started would wait forever)
        self._written: dict[Path, str] = {}

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def start(self) -> None:
        if self.kubelet:
            self.kubelet.start()
        self.poller.poll_telemetry()
        self.poller.poll_processes_and_jobs()
        self.poller.start()
        self._serving = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True,
                         name=f"exporter {self.node.host}").start()

    def stop(self) -> None:
        """Stop what start() started and close the rest (a node ticked by hand, never started, too)."""
        if self._serving:
            self.server.shutdown()
        self.server.server_close()
        self.poller.stop()
        if self.kubelet:
            self.kubelet.stop()

    def write(self, path: Path, text: str | None) -> None:
        """Replace `path` atomically when its content changes; None removes it."""
        if self._written.get(path) == text:
            return
        if text is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        self._written[path] = text


class LiveFleet:
    def __init__(self, fleet: Fleet, workdir: Path, clock=time.time, tick_seconds: float = 5.0):
        self.fleet = fleet
        self.clock = clock
        self.tick_seconds = tick_seconds
        self._sockets = Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))  # unix socket paths must be short
        lost_host, lost_index = fleet.lost_gpu
        self.nodes = {n.host: NodeRuntime(n, workdir / "nodes" / n.host, self._sockets, lost_index if n.host == lost_host else None)
                      for n in fleet.nodes}
        self._slots = [s for n in fleet.nodes for s in node_slots(n)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._holders = _holders(fleet)
        self._checkpointed: dict[str, datetime] = {}  # job key -> the last checkpoint it reported

    def urls(self, cluster: str) -> list[str]:
        return [rt.url for rt in self.nodes.values() if rt.node.cluster == cluster]

    def start(self) -> None:
        self.tick()
        for rt in self.nodes.values():
            rt.start()
        self._thread = threading.Thread(target=self._run, daemon=True, name="demo fleet driver")
        self._thread.start()

    def stop(self) -> None:
        """Stop the fleet, started or only ticked by hand (tests drive its nodes' pollers themselves): its exporters and
        kubelets, its pollers' backends, and its sockets' directory."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        for rt in self.nodes.values():
            rt.stop()
        shutil.rmtree(self._sockets, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a bad tick must not stop the fleet
                log.exception("simulated fleet tick failed")

    def holders(self, at: datetime) -> list[Job | None]:
        """The job holding each device (in self._slots order) at `at`."""
        out = []
        for s in self._slots:
            job = None
            for j in self._holders.get(s.key, ()):
                if j.start <= at < j.end:
                    job = j
                    break
            out.append(job)
        return out

    def tick(self) -> None:
        now_s = int(self.clock())
        now = EPOCH + timedelta(seconds=now_s)
        jobs = self.holders(now)
        frame = pl.DataFrame({
            "t": [now_s] * len(jobs), "slot": list(range(len(jobs))),
            "prof": [PROFILE_CODE[j.profile] if j else None for j in jobs],
            "s0": [epoch(j.start) if j else 0 for j in jobs],
            **{k: [j.params[i] if j else 0.0 for j in jobs] for i, k in enumerate(("a", "b", "c", "off"))},
        }, schema_overrides={"prof": pl.Int8, "s0": pl.Int64, "t": pl.Int64})
        values = load.evaluate(frame).to_dicts()
        per_gpu: dict[tuple[str, int], list[tuple[Slot, Job | None, dict]]] = {}
        for s, j, v in zip(self._slots, jobs, values):
            per_gpu.setdefault((s.node.host, s.gpu), []).append((s, j, v))
        pods: dict[str, list] = {}
        for (host, gpu), devices in per_gpu.items():
            rt = self.nodes[host]
            rt.write(rt.control / f"{gpu}.toml", _control_toml(devices))
            if rt.node.cluster == "hpc":
                j = devices[0][1]
                rt.write(rt.jobmap / str(gpu), f"{j.job_id}\n" if j else None)
            else:
                for s, j, _ in devices:
                    if j:
                        device = s.mig_uuid or s.gpu_uuid
                        resource = f"nvidia.com/mig-{s.mig_profile}" if s.mig_profile else "nvidia.com/gpu"
                        pods.setdefault(host, []).append((j.partition, j.job_id, j.name, resource, device))
        self.report_checkpoints(jobs, now)
        for host, rt in self.nodes.items():
            if rt.kubelet:
                grouped: dict[tuple, list[str]] = {}
                for ns, pod, container, resource, device in pods.get(host, []):
                    grouped.setdefault((ns, pod, container, resource), []).append(device)
                rt.kubelet.set_pods([(*k, tuple(v)) for k, v in grouped.items()])


    def report_checkpoints(self, jobs: list[Job | None], now: datetime) -> None:
        """Each running job that reports checkpoints (checkpoints.reports) says it saved its last
        one up to `now`, as a training script would: checkpoint_saved from its first GPU's node."""
        for j in {id(j): j for j in jobs if j is not None}.values():
            rt = self.nodes.get(j.slots[0].node.host)
            if rt is None or not checkpoints.reports(j):
                continue
            done = self._checkpointed.get(j.job_key)
            saved = checkpoints.saved(j, done or j.start, now + timedelta(microseconds=1))
            if not saved or saved[-1][0] == done:
                continue
            at, took = saved[-1]
            checkpoint_saved(took, saved_at=(at - EPOCH).total_seconds(), job_id=j.job_id, directory=rt.job_reports)
            self._checkpointed[j.job_key] = at


def _holders(fleet: Fleet) -> dict[tuple, list[Job]]:
    out: dict[tuple, list[Job]] = {}
    for j in fleet.jobs:
        for s in j.slots:
            out.setdefault(s.key, []).append(j)
    return out


def _pid(job: Job, slot: Slot) -> int:
    return 20_000 + (job.seed % 40_000) + slot.gpu * 8 + (slot.gpu_instance or 0)


def _control_toml(devices: list[tuple[Slot, Job | None, dict]]) -> str:
    """The simulator control file of one GPU (all its MIG instances) from evaluated load."""
    procs = [
        f"{{ pid = {_pid(j, s)}, used_memory_mib = {v['fb_mib']:.0f}, sm_util = {v['util']:.0f}"
        + (f", gpu_instance_id = {s.gpu_instance}" if s.gpu_instance else "") + " }"
        for s, j, v in devices if j and v["procs"]
    ]
    lines = [f"processes = [{', '.join(procs)}]"]
    if devices[0][0].gpu_instance is None:
        v = devices[0][2]
        lines += [f"utilization = {v['util']:.0f}", f"tensor_active = {v['tensor']:.4f}",
                  f"fields = {{ DCGM_FI_PROF_SM_ACTIVE = {v['sm_active']:.4f}, DCGM_FI_PROF_PCIE_RX_BYTES = {v['pcie_rx']:.0f}, "
                  f"DCGM_FI_PROF_NVLINK_RX_BYTES = {v['nvlink'] / 2:.0f}, DCGM_FI_PROF_NVLINK_TX_BYTES = {v['nvlink'] / 2:.0f} }}"]
    else:
        lines.append(f"utilization = {sum(v['util'] for _, _, v in devices) / len(devices):.1f}")
        lines.append("instances = { " + ", ".join(f'"{s.gpu_instance}" = {v["util"]:.0f}' for s, _, v in devices) + " }")
    return "\n".join(lines) + "\n"
