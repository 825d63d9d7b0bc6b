"""The `gpufleet` console script: one entry point, one subcommand per job.

Only the chosen subcommand's module is imported, and only after its extra is known to be installed,
so `gpufleet exporter` runs on a GPU node that has only prometheus-client and nvidia-ml-py, and
`gpufleet collect` there says in one line what to install.
Exit status: 0 success, 2 bad usage or configuration, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import logging
import re
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterator

from gpufleet.procs import exit_with_parent
from gpufleet.version import DISTRIBUTION, version

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _collect_hooks() -> dict[str, Any]:
    """The collector service also runs the weekly report and the idle-GPU policy. Both sit above the
    collector, so the shell, which sees all three, hands their jobs in (imported lazily: no [report], no cost)."""
    from gpufleet.policy import enforce
    from gpufleet.report import job

    return {"scheduled_jobs": (job.scheduled, enforce.scheduled)}


@dataclass(frozen=True)
class Subcommand:
    module: str  # has add_arguments(parser) and run(args, out, **hooks)
    help: str
    extra: str | None  # the pip extra it needs beyond the exporter's two dependencies
    hooks: Callable[[], dict[str, Any]] | None = None
    pandas: bool = True  # False: it runs with pandas refused (_without_pandas)


SUBCOMMANDS = {
    "exporter": Subcommand("gpufleet.exporter.cli", "serve GPU metrics (NVML or simulated) and the job-to-GPU mapping", None),
    "collect": Subcommand("gpufleet.collector.cli", "collect metrics and scheduler accounting into the store", "collector", _collect_hooks),
    "analyze": Subcommand("gpufleet.analytics.cli", "print a window's utilization, waste and cost (table or JSON)", "collector",
                          pandas=False),
    "dashboard": Subcommand("gpufleet.dashboards.cli", "serve the operators' Streamlit dashboards over the store", "dashboards"),
    "report": Subcommand("gpufleet.report.cli", "write the weekly waste report (HTML, PDF, text) and mail it", "report", pandas=False),
    "policy": Subcommand("gpufleet.policy.cli", "warn owners of idle GPUs, escalate and cancel by [policy] (dry run first)", "report",
                         pandas=False),
    "demo": Subcommand("gpufleet.demo", "run the product on a simulated fleet, no GPU or root needed", "all"),
}


def missing_for_extra(extra: str) -> list[str]:
    """Distributions that `pip install 'gpufleet[extra]'` would add, as the installed metadata lists
    them (pyproject.toml is the one place they are named). [] when all are there, or when gpufleet
    runs from a source tree without metadata (nothing to check against)."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    missing: list[str] = []
    for req in requires:
        marker = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if not marker or marker.group(1) != extra:
            continue
        name, nested = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req).groups()
        if name.lower() == DISTRIBUTION:  # e.g. dashboards = ["gpufleet[collector]", ...]
            for sub in (nested or "").split(","):
                missing += [m for m in missing_for_extra(sub.strip()) if m not in missing]
            continue
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            if name not in missing:
                missing.append(name)
    return missing


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses `import pandas`, as where it is not installed."""

    def __init__(self, command: str):
        self.command = command

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}: gpufleet {self.command} runs without pandas "
                                      f"(gpufleet.cli SUBCOMMANDS: pandas=False)", name=name)
        return None


@contextmanager
def _without_pandas(command: str) -> Iterator[None]:
    """`command` run with pandas refused: pyarrow (26) imports pandas, where installed, at its first
    conversion to or from numpy only to learn whether values might be pandas objects (~0.2 s and
    ~50 MiB of a `gpufleet analyze`, whose code has none). Refused, pyarrow converts without it.
    Nothing is refused where pandas was imported already (a caller in the same process)."""
    if "pandas" in sys.modules:
        yield
        return
    refuse = _NoPandas(command)
    sys.meta_path.insert(0, refuse)
    try:
        yield
    finally:
        sys.meta_path.remove(refuse)


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line (options before it take no subcommand names)."""
    return next((a for a in argv if a in SUBCOMMANDS), None)


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; only `command`'s module is imported for its options."""
    p = argparse.ArgumentParser(prog="gpufleet", description="GPU fleet observability and utilization analytics")
    p.add_argument("--version", action="version", version=f"gpufleet {version()}")
    p.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help="how much to log on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=cmd.help, description=cmd.help)
        sp.add_argument("--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS, help="how much to log on stderr (default INFO)")
        if name == command:
            importlib.import_module(cmd.module).add_arguments(sp)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """A whole command line, parsed with the chosen subcommand's options (argparse's exit 2 and
    message on a bad one)."""
    return parser(_chosen(argv)).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _chosen(argv)
    with _without_pandas(command) if command and not SUBCOMMANDS[command].pandas else nullcontext():
        return _main(argv, command)


def _main(argv: list[str], command: str | None) -> int:
    if command and SUBCOMMANDS[command].extra:
        missing = missing_for_extra(SUBCOMMANDS[command].extra)
        if missing:
            extra = SUBCOMMANDS[command].extra
            sys.stderr.write(f"gpufleet {command} needs the '{extra}' extra (missing: {', '.join(missing)}): "
                             f"pip install '{DISTRIBUTION}[{extra}]'\n")
            return 2
    args = parse_args(argv)
    if not getattr(args, "command", None):
        parser().print_help(sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    cmd = SUBCOMMANDS[args.command]
    module = importlib.import_module(cmd.module)
    exit_with_parent()
    try:
        return module.run(args, out=sys.stdout, **(cmd.hooks() if cmd.hooks else {}))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
