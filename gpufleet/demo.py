"""`gpufleet demo`: the product on a simulated node, with no GPU and no root.

For now it serves the exporter on a simulated 8 x H100 node (busy training GPUs, an inference
cycle, an idle notebook, a GPU held with no process, and one that throws XIDs and falls off the
bus) and prints where its metrics are. The collector, dashboard and report join it as they land.
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:9402", help="HOST:PORT for the simulated exporter (default 127.0.0.1:9402)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (the demo never does yet)")


def run(args: argparse.Namespace, out=None) -> int:
    from exporter import cli as exporter_cli

    scenario = resources.files("exporter.scenarios") / "demo-node.toml"
    with tempfile.TemporaryDirectory(prefix="gpufleet-demo-") as tmp:
        with resources.as_file(scenario) as scenario_path:
            config = Path(tmp) / "gpufleet.toml"
            config.write_text(
                "[exporter]\ncgroup_mapping = false\n"
                f'device_map_file = "{Path(tmp) / "gpu-devices.tsv"}"\n'
                'kubelet_socket = ""\n'
            )
            ex_args = argparse.Namespace(
                config=str(config), backend="sim", sim_gpus=None, sim_model=None,
                sim_scenario=str(scenario_path), listen=args.listen, web_config=None,
                job_map_dir=None, poll_interval=None, hostname=None,
            )
            if out is not None:
                out.write("gpufleet demo: simulated node sim-h100-01 (8 x H100); Ctrl-C stops it\n")
            return exporter_cli.run(ex_args, out=out)
