"""bench._common's side-by-side runs: the code before is the checkout named, not the editable install's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._common import ROOT, before_checkout, in_checkout


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
