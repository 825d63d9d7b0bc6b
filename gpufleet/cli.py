"""The `gpufleet` console script: one entry point, one subcommand per job.

Subcommand modules are imported only when chosen, so `gpufleet exporter` runs on a GPU node
that has only prometheus-client and nvidia-ml-py installed.
Exit status: 0 success, 2 bad usage or configuration, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gpufleet.procs import exit_with_parent

# subcommand -> (module with add_arguments/run, help)
SUBCOMMANDS = {
    "exporter": ("gpufleet.exporter.cli", "serve GPU metrics (NVML or simulated) and the job-to-GPU mapping"),
    "collect": ("gpufleet.collector.cli", "collect metrics and scheduler accounting into the store"),
    "analyze": ("gpufleet.analytics.cli", "print a window's utilization, waste and cost (table or JSON)"),
    "dashboard": ("gpufleet.dashboards.cli", "serve the operators' Streamlit dashboards over the store"),
    "report": ("gpufleet.report.cli", "write the weekly waste report (HTML, PDF, text) and mail it"),
    "demo": ("gpufleet.demo", "run the product on a simulated node, no GPU or root needed"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet", description="GPU fleet observability and utilization analytics")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(_module=module)
        sp.add_argument("--log-level", default=argparse.SUPPRESS, choices=("DEBUG", "INFO", "WARNING", "ERROR"))
        importlib.import_module(module).add_arguments(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not getattr(args, "command", None):
        p.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    module = importlib.import_module(args._module)
    exit_with_parent()
    try:
        return module.run(args, out=sys.stdout)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
