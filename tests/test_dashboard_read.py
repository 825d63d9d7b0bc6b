"""Every page of the demo's dashboard, read as a person reads it, in a real headless Chromium at
1,600 px: the served `gpufleet dashboard` on the demo's backfilled week (tests/support/demo_site.py).

From the rendered page (the data grid's accessibility table, Vega's SVG and its ARIA labels):
- no table cell says "None", "NaN" or "-1", or a verdict's machine name (idle_stretches);
- every bar of the idle-by-team chart and every host row of the Health heat map is labelled;
- the utilization chart marks its last, partial bucket as partial;
- time axes carry dates (24-hour clock, UTC);
- a job's charts list every GPU of the job in their legend;
- /fleet-now opens Fleet now (not "Page not found").

Artifacts: test-artifacts/dashboard-read/<page>.png and .json (what was read; git-ignored).
Under CI=true a missing Chromium fails the test (tests/realstack/policy.py).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from tests.realstack.process import HarnessError, wait_for
from tests.support.browser import Browser
from tests.support.demo_site import PAGES, build, serve
from tests.test_dashboard_browser import ERROR_MARKERS, chromium_binary

pytestmark = pytest.mark.realstack

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "dashboard-read"
WIDTH = 1600
RAW = {"None", "NaN", "nan", "-1", "null", "NaT"}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("streamlit")
    binary = chromium_binary()
    from gpufleet.times import utcnow

    workdir = tmp_path_factory.mktemp("dash-read")
    now = utcnow().replace(microsecond=0)
    fleet = build(workdir, now)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with serve(workdir, fleet) as url, Browser(binary, workdir, width=WIDTH) as browser:
        yield {"url": url, "browser": browser, "fleet": fleet, "store": workdir / "store", "now": now}


def read(site, name: str, path: str, title: str) -> dict:
    """Open the page, screenshot it, and return what it shows (also kept as an artifact)."""
    b = site["browser"]
    b.load(site["url"] + path, timeout=240)
    b.settle()
    # every page shows a table or a chart once drawn (a rerun - a widget writing its default into the URL - redraws it)
    wait_for(f"{name} to show its tables and charts", lambda: bool(b.tables() or b.charts()), timeout=60, interval=1.0)
    b.settle()
    got = {"title": (b.js("document.querySelector('h1') && document.querySelector('h1').innerText") or "").strip(),
           "tables": b.tables(), "charts": b.charts(), "dom": b.dom()}
    b.screenshot(ARTIFACTS / f"{name}.png")  # (after reading: a screenshot resizes the page, and its charts redraw)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps({k: v for k, v in got.items() if k != "dom"}, indent=1))
    assert got["title"] == title, (name, got["title"])
    assert "Page not found" not in got["dom"], name
    for marker in ERROR_MARKERS:
        assert marker not in got["dom"], f"{name}: {marker} (see {ARTIFACTS / name}.png)"
    return got


def raw_cells(got: dict) -> list[tuple[str, str]]:
    from gpufleet.analytics.vocabulary import VERDICTS

    machine = {k for k in VERDICTS if "_" in k}
    return [(key, c) for key, t in got["tables"].items() for c in t["cells"] if c in RAW or c in machine]


def time_charts(got: dict) -> list[dict]:
    # (a label with its date is two lines, "22:00" over "2026-11-30": its text reads "22:002026-11-30")
    return [c for c in got["charts"] if any(re.fullmatch(r"\d{2}:\d{2}(\d{4}-\d{2}-\d{2})?", x) for x in c["x"])]


def test_every_page_reads_right(site):
    problems = []
    for name, path, title in PAGES:
        got = read(site, name, path, title)
        bad = raw_cells(got)
        if bad:
            problems.append(f"{name}: raw values in tables (table, cell): {bad[:8]}")
        if name in ("utilization", "utilization_by_account", "health") and not time_charts(got):
            problems.append(f"{name}: no time chart drawn (a chart Vega rejects is blank): {got['charts']}")
        for chart in time_charts(got):
            if not any(DATE.search(x) for x in chart["x"]):
                problems.append(f"{name}: a time axis without a date: {chart['x']}")
            if any(re.search(r"\b(AM|PM)\b", x) for x in chart["x"]):
                problems.append(f"{name}: a 12-hour clock on a time axis: {chart['x']}")
    assert not problems, "\n".join(problems)


def test_the_tables_were_read(site):
    """(The checks above read cells: they must find some, or they say nothing.)"""
    got = read(site, "jobs", "/jobs", "Jobs")
    assert len(got["tables"]["jobs_list"]["cells"]) > 50, got["tables"].keys()
    headers = got["tables"]["jobs_list"]["headers"]
    # key columns first: the job, its idle GPU-hours and its verdict
    assert [h.lower() for h in headers[:3]] == ["job", "idle gpu-h in window", "verdict"], headers


def test_idle_by_team_names_every_bar(site):
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import open_reader

    got = read(site, "waste", "/waste", "Waste and cost")
    now = site["now"]
    accounts = Analysis(open_reader(site["store"]), Params(start=now - timedelta(days=1), end=now), now=now).waste_by("account", "idle")
    want = set(accounts.filter(accounts["gpu_h"] > 0)["account"].fill_null("(none)").to_list()[:15])
    bars = [c for c in got["charts"] if c["y"] and set(c["y"]) <= want | {"(none)"}]
    assert bars, [c["y"] for c in got["charts"]]
    assert set(bars[0]["y"]) == want, (sorted(bars[0]["y"]), sorted(want))


def test_health_heat_map_names_every_host(site):
    got = read(site, "health", "/health", "Health")
    hosts = {n.host for n in site["fleet"].nodes}
    rows = [c for c in got["charts"] if set(c["y"]) & hosts]
    assert rows, [c["y"] for c in got["charts"]]
    assert set(rows[0]["y"]) == hosts, sorted(hosts - set(rows[0]["y"]))


def test_the_current_bucket_is_marked_partial(site):
    """A bucket cut by the window's end is marked partial. The window ends inside the site's data
    (a typed window from a whole hour to a minute off every bucket edge), not at the wall clock:
    the site has no collector, so once the clock passes an hour the newest bucket has no data."""
    start = site["now"].replace(minute=0, second=0) - timedelta(days=1, hours=1)
    end = start + timedelta(days=1, minutes=37)
    got = read(site, "utilization", f"/utilization?window=custom&from={start:%Y-%m-%dT%H:%M}&to={end:%Y-%m-%dT%H:%M}",
               "Utilization")
    chart = next(c for c in got["charts"] if "capacity" in c["legend"])
    assert "partial" in chart["legend"], chart["legend"]
    partial = [m for m in chart["marks"] if "partial" in (m or "")]
    assert partial, chart["marks"][-5:]


def test_a_job_page_lists_every_gpu(site):
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import open_reader

    now = site["now"]
    a = Analysis(open_reader(site["store"]), Params(start=now - timedelta(days=1), end=now), now=now)
    job = a.top_wasteful_jobs(1).row(0, named=True)
    got = read(site, "job", f"/jobs?job={job['job_id']}", "Jobs")
    assert "Job report" in got["dom"]
    gpus = [c for c in got["charts"] if c["legend"] and all(" / GPU " in x for x in c["legend"])]
    if not gpus:
        raise HarnessError(f"no per-GPU chart on job {job['job_id']}'s page: {[c['legend'] for c in got['charts']]}")
    per_gpu = got["tables"]["job_gpus"]  # the job's per-GPU table: one row per GPU (or MIG instance)
    assert len(gpus[0]["legend"]) == len(per_gpu["cells"]) // len(per_gpu["headers"]) > 1, (gpus[0]["legend"], per_gpu)
    assert not raw_cells(got), raw_cells(got)[:8]
