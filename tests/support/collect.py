"""`gpufleet collect` run in-process on a store, with a config of one scrape target that is never
scraped (the maintenance mode --rebuild-facts)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from gpufleet.collector import cli as collector_cli


def run_collect(tmp: Path, store: Path, analytics: str, *args: str) -> tuple[int, str]:
    """Exit status and output of `gpufleet collect --config C *args` on `store`; `analytics`: the
    [analytics] section's lines."""
    cfg = tmp / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{store}"\nlisten = ""\n[collector.scrape]\ntargets = ["127.0.0.1:9"]\n[analytics]\n{analytics}')
    p = argparse.ArgumentParser()
    collector_cli.add_arguments(p)
    out = io.StringIO()
    return collector_cli.run(p.parse_args(["--config", str(cfg), *args]), out=out), out.getvalue()
