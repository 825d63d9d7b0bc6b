"""`gpufleet analyze` imports only what it uses (issue #52): its command line and the modules its
run reads through import neither pandas nor Streamlit (the dashboards' stack, and pandas' second
of start-up), nor pyarrow.compute (the store's writer's; 0.07 s), checked in a fresh process, as a user's `gpufleet analyze` starts; and its run on a
store, whose numpy conversions make pyarrow ask for pandas, leaves pandas unimported with the
figures it gives with pandas there."""

from __future__ import annotations

import json
import subprocess
import sys

from test_analytics_golden import T, build_golden

from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter

# the CLI path of `gpufleet analyze`: the console script's parser with the subcommand's options,
# then what analytics/cli.py's run and build_report import at their point of use
ANALYZE_PATH = """
import sys
from gpufleet import cli
cli.parser("analyze")
from gpufleet.analytics import cli as analyze, core, fairness, jobs, mfu, params, queue_gaps, reliability, reliability_store, states, trends
from gpufleet.collector import store
print(",".join(sorted(m for m in ("pandas", "streamlit", "altair", "jinja2", "pyarrow.compute") if m in sys.modules)))
"""


def test_the_analyze_path_imports_no_pandas_or_streamlit():
    r = subprocess.run([sys.executable, "-c", ANALYZE_PATH], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"gpufleet analyze's modules import {r.stdout.strip()}: import them where they are used"


# `gpufleet analyze` of a store in a fresh process (pandas refused or, with PANDAS True, allowed as
# for other commands): its JSON, and on stderr whether pandas was imported
ANALYZE_RUN = """
import dataclasses, sys
from gpufleet import cli
cli.SUBCOMMANDS["analyze"] = dataclasses.replace(cli.SUBCOMMANDS["analyze"], pandas=PANDAS)
rc = cli.main(["analyze", "--store", sys.argv[1], "--from", sys.argv[2], "--to", sys.argv[3], "--format", "json", "--job", "104"])
sys.stderr.write(f"pandas={'pandas' in sys.modules} rc={rc}")
"""


def analyze(root, start: str, end: str, pandas: bool) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", ANALYZE_RUN.replace("PANDAS", str(pandas)), str(root), start, end],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.endswith("rc=0"), r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr.rsplit("pandas=", 1)[1]


def test_analyze_runs_without_pandas_and_gives_the_same_figures(tmp_path):
    """The golden store with its facts, a window cut inside 5-minute buckets (its edge minutes read
    raw: pyarrow's numpy conversions), a job's report: pandas is not imported, and the JSON is the
    one the same run gives where pandas may be imported."""
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20), facts_hours=None)
    w.close()
    start, end = T(9, 17, 3).isoformat() + "Z", T(11, 59, 59).isoformat() + "Z"
    refused, said = analyze(tmp_path, start, end, pandas=False)
    assert said == "False rc=0", said
    allowed, _ = analyze(tmp_path, start, end, pandas=True)
    assert refused == allowed and refused["totals"]["allocated_gpu_h"] > 0


REFUSED = """
import sys
import numpy as np, pyarrow as pa
from gpufleet import cli
with cli._without_pandas("analyze"):
    pa.array(np.arange(3)).to_numpy()
    try:
        import pandas
    except ModuleNotFoundError as e:
        print(e)
import pandas
print(type(pa.table({"x": [1]}).to_pandas()).__name__, pa.array(pandas.Series([1.5])).type)
"""


def test_pandas_is_refused_only_inside_the_command_with_a_message_naming_it():
    r = subprocess.run([sys.executable, "-c", REFUSED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["No module named 'pandas': gpufleet analyze runs without pandas (gpufleet.cli SUBCOMMANDS: pandas=False)",
                                     "DataFrame double"], r.stdout


# a subcommand in a fresh process, pandas refused or allowed as above: its output, and on stderr
# whether pandas was imported
COMMAND_RUN = """
import dataclasses, sys
from gpufleet import cli
cli.SUBCOMMANDS[sys.argv[1]] = dataclasses.replace(cli.SUBCOMMANDS[sys.argv[1]], pandas=PANDAS)
rc = cli.main(sys.argv[1:])
sys.stderr.write(f"pandas={'pandas' in sys.modules} rc={rc}")
"""


def run_both(args) -> dict[bool, str]:
    """`gpufleet ARGS`' output with pandas refused (False) and allowed (True) - `args(pandas)` the
    arguments of each run; refused, pandas must not have been imported."""
    out = {}
    for pandas in (False, True):
        r = subprocess.run([sys.executable, "-c", COMMAND_RUN.replace("PANDAS", str(pandas)), *args(pandas)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stderr.endswith("rc=0"), r.stderr[-3000:]
        assert pandas or r.stderr.rsplit("pandas=", 1)[1] == "False rc=0", r.stderr[-300:]
        out[pandas] = r.stdout
    return out


def test_a_policy_round_and_the_weekly_report_run_without_pandas_and_give_the_same(tmp_path):
    """The policy's round (its plan over every GPU's states, the efficiency notes, the drains over
    the window's attempts) and the weekly report (fleet and a team, text and HTML) - pyarrow's
    conversions among them - run with pandas refused, as their subcommands do, and give what they
    give with pandas."""
    store = tmp_path / "store"
    build_golden(store)
    w = StoreWriter(store)
    compact(w, T(20), facts_hours=None)
    w.close()
    plans = run_both(lambda pandas: ["policy", "--store", str(store), "--as-of", T(11, 30).isoformat() + "Z", "--format", "json"])
    assert json.loads(plans[False]) == json.loads(plans[True]) and {"actions", "efficiency_notes", "drains"} <= json.loads(plans[False]).keys()
    run_both(lambda pandas: ["report", "--store", str(store), "--from", T(0).isoformat() + "Z", "--to", T(20).isoformat() + "Z",
                             "--out", str(tmp_path / f"report-{pandas}"), "--no-pdf", "--quiet", "--team", "physics"])
    texts = {pandas: sorted((f.name, [line for line in f.read_text().splitlines() if "generated" not in line.lower()])
                            for f in (tmp_path / f"report-{pandas}").iterdir() if f.suffix == ".txt") for pandas in (False, True)}
    assert texts[False] == texts[True] and len(texts[False]) == 2
