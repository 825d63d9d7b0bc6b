"""bench._common's side-by-side runs: the code before is the checkout named, not the editable install's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._common import ROOT, before_checkout, in_checkout, run_python


def test_a_command_in_another_checkout_imports_that_checkouts_packages(tmp_path):
    """A checkout's folders map to gpufleet.* through pyproject's package-dir; PYTHONPATH alone imported the editable
    install's (this checkout's) gpufleet.analytics, so an A/B compared this code with itself."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"gpufleet" = "gpufleet"\n"gpufleet.analytics" = "analytics"\n')
    for folder, text in (("gpufleet", ""), ("analytics", "WHERE = 'the other checkout'\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(text)
    (tmp_path / "analytics" / "facts.py").write_text("WHERE = 'its module'\n")
    code = "import gpufleet.analytics as a, gpufleet.analytics.facts as f; print(a.WHERE, '|', f.WHERE, '|', f.__file__)"
    out = subprocess.run([sys.executable, "-c", in_checkout(code, tmp_path)], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"the other checkout | its module | {tmp_path / 'analytics' / 'facts.py'}"
    # this checkout's, without the prelude
    here = subprocess.run([sys.executable, "-c", "import gpufleet.analytics.facts as f; print(f.__file__)"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert Path(here.strip()) == ROOT / "analytics" / "facts.py"


def test_the_before_checkout_must_be_one(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_BENCH_BEFORE", raising=False)
    assert before_checkout() is None
    monkeypatch.setenv("GPUFLEET_BENCH_BEFORE", str(tmp_path))
    with pytest.raises(ValueError, match="expected a checkout of gpufleet"):
        before_checkout()
    (tmp_path / "pyproject.toml").write_text("")
    assert before_checkout() == tmp_path.resolve()


def test_a_child_s_peak_rss_is_its_own_not_its_big_parent_s():
    """Linux keeps the larger of the old and the new image's high-water RSS across exec, so wait4's ru_maxrss of a
    child spawned by a bench that had just generated its store (1.25 GiB) read 1.25 GiB for every `gpufleet
    analyze` run: run_python reports the child's own VmHWM."""
    ballast = bytearray(600 * 2**20)  # touched: resident in this process
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    wall, cpu, gib, out = run_python("import sys; print('ran', sys.argv[1])", ["here"])
    assert out.strip() == b"ran here" and wall > 0 and cpu > 0
    assert 0.001 < gib < 0.25, gib  # an interpreter's own, not the parent's 0.6 GiB
    with pytest.raises(RuntimeError, match="exited 3"):
        run_python("import sys; sys.exit(3)", [])
    del ballast


def test_analyze_goals_count_start_up_only_where_the_issue_does():
    """#52: 1,024 GPUs 0.5 s beyond start-up and 0.3 GiB; 16,384 GPUs 1.5 s in all and 1 GiB."""
    from bench.analyze import GOALS

    small, large = GOALS[1024], GOALS[16384]
    assert small.met(wall=0.9, start_up=0.41, gib=0.29) and not small.met(wall=0.95, start_up=0.41, gib=0.29)
    assert not small.met(wall=0.5, start_up=0.41, gib=0.31)
    assert large.met(wall=1.5, start_up=0.4, gib=1.0) and not large.met(wall=1.6, start_up=0.4, gib=0.5)


def test_the_dashboards_bench_shows_the_code_before_beside_each_first_load():
    """GPUFLEET_BENCH_BEFORE on `bench dashboards`: a page's figure of the code before and this code's ratio to it, nothing
    without the code before or where it has no such page."""
    from bench.dashboards import _beside

    before = {"first": {"health": 0.7, "jobs+report": 0.0}}
    assert _beside(before, "first", "health", 0.35) == " (before 0.7 s, x0.50)"
    assert _beside(None, "first", "health", 0.35) == ""
    assert _beside(before, "first", "mfu", 0.2) == ""
    assert _beside(before, "first", "jobs+report", 0.2) == " (before 0.0 s)"
