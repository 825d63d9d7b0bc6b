"""`gpufleet exporter`: options, wiring, and the serve loop."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from gpufleet.config import ConfigError, Option, boolean, host_port, integer, load_config, number, one_of, section, string
from gpufleet.procs import stop_on_signals, wait_until_stopped

log = logging.getLogger(__name__)

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

OPTIONS = (
    Option("listen", "0.0.0.0:9402", "HOST:PORT", host_port),
    Option("backend", "nvml", "nvml or sim", one_of("nvml", "sim")),
    Option("poll_interval", 5.0, "a number of seconds > 0", number(0)),
    Option("process_interval", 15.0, "a number of seconds > 0 (process lists and job mapping)", number(0)),
    Option("hostname", "", "a string (default: $NODE_NAME, else the host name)", string),
    Option("job_map_dir", "", "a directory path, or \"\" to disable Slurm mapping files", string),
    Option("job_report_dir", "/run/gpufleet/job-reports", "a directory path (exporter/jobreport.py writes it), or \"\" to disable", string),
    Option("job_report_max_age", 120.0, "a number of seconds > 0 (older job reports are dropped)", number(0)),
    Option("device_map_file", "/run/gpufleet/gpu-devices.tsv", "a file path, or \"\" not to write one", string),
    Option("cgroup_mapping", True, "true or false", boolean),
    Option("kubelet_socket", "auto", "a socket path, \"auto\" (use it if it exists) or \"\" to disable", string),
    Option("kubelet_timeout", 2.0, "a number of seconds > 0", number(0)),
    Option("web_config", "", "a web-config YAML path, or \"\"", string),
    Option("sim_gpus", 8, "an integer >= 1", integer(1)),
    Option("sim_model", "h100", "a GPU model name or alias", string),
    Option("sim_scenario", "", "a scenario TOML path, or \"\"", string),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([exporter] section)")
    p.add_argument("--backend", choices=("nvml", "sim"), help="where readings come from: the GPUs via NVML, or simulated GPUs (default: [exporter] backend, nvml)")
    p.add_argument("--sim-gpus", type=int, help="number of simulated GPUs")
    p.add_argument("--sim-model", help="simulated GPU model (h100, a100, a100-40gb, l4, t4 or an NVML name)")
    p.add_argument("--sim-scenario", help="simulation scenario TOML file")
    p.add_argument("--listen", help="HOST:PORT to serve /metrics on (default 0.0.0.0:9402)")
    p.add_argument("--web-config", help="Prometheus web-config YAML file (TLS, basic auth)")
    p.add_argument("--job-map-dir", help="dcgm-exporter style Slurm job-mapping directory")
    p.add_argument("--poll-interval", type=float, help="seconds between telemetry polls")
    p.add_argument("--hostname", help="value of the Hostname label")


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config file section, then command-line flags on top; validated as one."""
    doc = load_config(args.config)
    raw = dict(doc.get("exporter", {})) if isinstance(doc.get("exporter", {}), dict) else doc.get("exporter")
    for key in ("backend", "sim_gpus", "sim_model", "sim_scenario", "listen", "web_config", "job_map_dir", "poll_interval", "hostname"):
        value = getattr(args, key, None)
        if value is not None:
            raw[key] = value
    return section({"exporter": raw}, "exporter", OPTIONS, args.config)


def build(opts: dict[str, Any]):
    """Construct backend, mapping sources and poller from validated options."""
    from gpufleet.exporter.jobmap.cgroup import CgroupProcessSource
    from gpufleet.exporter.jobmap.slurm_dir import SlurmMappingDirSource
    from gpufleet.exporter.poller import Poller

    if opts["backend"] == "sim":
        from gpufleet.exporter.backends import sim, sim_scenario

        scenario = sim_scenario.load(opts["sim_scenario"] or None, model=opts["sim_model"] if not opts["sim_scenario"] else None, gpus=opts["sim_gpus"] if not opts["sim_scenario"] else None)
        backend = sim.SimBackend(scenario)
        default_host = scenario.hostname
    else:
        from gpufleet.exporter.backends.nvml import NvmlBackend

        backend = NvmlBackend()
        default_host = ""
    hostname = opts["hostname"] or default_host or os.environ.get("NODE_NAME") or socket.gethostname()
    sources = []
    if opts["job_map_dir"]:
        sources.append(SlurmMappingDirSource(opts["job_map_dir"]))
    if opts["cgroup_mapping"]:
        sources.append(CgroupProcessSource())
    sock = opts["kubelet_socket"]
    if sock == "auto":
        sock = DEFAULT_KUBELET_SOCKET if Path(DEFAULT_KUBELET_SOCKET).exists() else ""
    if sock:
        from gpufleet.exporter.jobmap.kubelet import KubeletPodResourcesSource

        sources.append(KubeletPodResourcesSource(sock, timeout=opts["kubelet_timeout"]))
    job_reports = None
    if opts["job_report_dir"]:
        from gpufleet.exporter.jobreports import JobReportSource

        job_reports = JobReportSource(opts["job_report_dir"], max_age=opts["job_report_max_age"])
    return Poller(
        backend,
        sources,
        job_reports=job_reports,
        hostname=hostname,
        poll_interval=opts["poll_interval"],
        process_interval=opts["process_interval"],
        device_map_file=opts["device_map_file"] or None,
    )


def run(args: argparse.Namespace, out=None) -> int:
    from gpufleet.exporter.web import load_web_config, make_server

    try:
        opts = resolve_options(args)
        web = load_web_config(opts["web_config"]) if opts["web_config"] else None
        poller = build(opts)
    except ConfigError as e:
        log.error("%s", e)
        return 2
    try:
        server = make_server(opts["listen"], poller.exposition, web)
    except OSError as e:
        log.error("cannot listen on %s: %s", opts["listen"], e)
        return 1
    host, port = server.server_address[:2]
    scheme = "https" if web and web.tls else "http"
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    poller.poll_telemetry()
    poller.poll_processes_and_jobs()
    poller.start()
    stop = stop_on_signals()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
    thread.start()
    log.info("gpufleet exporter (%s backend, %d GPUs) serving %s://%s:%s/metrics", poller.backend.name, len(poller.snapshot.gpus), scheme, shown, port)
    if out is not None:
        out.write(f"gpufleet exporter: metrics at {scheme}://{shown}:{port}/metrics\n")
        out.flush()
    wait_until_stopped(stop)
    log.info("stopping")
    server.shutdown()
    poller.stop()
    return 0
