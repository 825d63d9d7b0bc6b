"""`gpufleet analyze` imports only what it uses (issue #52): its command line and the modules its
run reads through import neither pandas nor Streamlit (the dashboards' stack, and pandas' second
of start-up), checked in a fresh process, as a user's `gpufleet analyze` starts."""

from __future__ import annotations

import subprocess
import sys

# the CLI path of `gpufleet analyze`: the console script's parser with the subcommand's options,
# then what analytics/cli.py's run and build_report import at their point of use
ANALYZE_PATH = """
import sys
from gpufleet import cli
cli.parser("analyze")
from gpufleet.analytics import cli as analyze, core, fairness, jobs, mfu, params, queue_gaps, reliability, reliability_store, states, trends
from gpufleet.collector import store
print(",".join(sorted(m for m in ("pandas", "streamlit", "altair", "jinja2") if m in sys.modules)))
"""


def test_the_analyze_path_imports_no_pandas_or_streamlit():
    r = subprocess.run([sys.executable, "-c", ANALYZE_PATH], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"gpufleet analyze's modules import {r.stdout.strip()}: import them where they are used"
