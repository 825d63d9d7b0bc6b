"""What a user installs: one import root, an exporter that installs and runs alone, and layers that
import only downward (import-linter on the built wheel, so this is what CI enforces).

The wheel, not the source tree, is what the contracts are checked on: in the repository the parts
live in top-level folders that only packaging maps into `gpufleet`, so the installed tree is the
one place where `gpufleet.collector` and `gpufleet.analytics` sit side by side as grimp sees them.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.realstack.process import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
OLD_ROOTS = {"exporter", "collector", "analytics", "dashboards"}
HEAVY = ("duckdb", "polars", "pyarrow", "numpy", "streamlit", "altair", "apscheduler", "httpx", "jinja2")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("gpufleet-*.whl")
    return whl


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("installed")
    zipfile.ZipFile(wheel).extractall(tree)
    return tree


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """import-linter over an installed tree (run from inside it, so the repository's own folders
    are not on the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_installs_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gpufleet"}
    # every part is inside it, with its data files
    for part in ("exporter/cli.py", "collector/store.py", "analytics/core.py", "report/cli.py", "report/templates/report.html.j2",
                 "dashboards/app.py", "analytics/data/prices.csv", "exporter/scenarios/demo-node.toml", "exporter/jobreport.py"):
        assert f"gpufleet/{part}" in names, part
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["gpufleet"]


def test_layer_contracts_hold_on_the_installed_tree(unpacked):
    r = lint_imports(unpacked)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") == 5, r.stdout[-3000:]


@pytest.mark.parametrize(("module", "planted", "contract"), [
    # the store reaching up into the analytics
    ("gpufleet/collector/store.py", "from gpufleet.analytics import core", "Layers import only downward"),
    # the job API on a GPU node pulling in a heavy library
    ("gpufleet/exporter/jobreport.py", "import polars", "import nothing heavy"),
    # the analytics reading the collector's sources instead of the store
    ("gpufleet/analytics/jobs.py", "from gpufleet.collector.sources import slurm", "never the collector's sources"),
    # a circle inside a package
    ("gpufleet/collector/schema.py", "from gpufleet.collector import store", "No import cycles"),
])
def test_a_planted_bad_import_breaks_its_contract(unpacked, tmp_path, module, planted, contract):
    tree = tmp_path / "tree"
    shutil.copytree(unpacked, tree)
    target = tree / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = lint_imports(tree)
    assert r.returncode != 0, r.stdout[-3000:]
    broken = r.stdout[r.stdout.index("Broken contracts"):]
    assert contract in broken, broken[:3000]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_nothing_imports_the_old_top_level_names():
    """In the repository `import exporter` would still resolve (the folder is on sys.path in
    tests), so an old-style import would pass here and fail for every user: forbid it."""
    offenders = [f"{p.relative_to(ROOT)}:{line}: {name}"
                 for folder in ("gpufleet", *sorted(OLD_ROOTS), "tests", "bench")
                 for p in (ROOT / folder).rglob("*.py")
                 for line, name in _imports(p) if name.split(".")[0] in OLD_ROOTS]
    assert offenders == []


def test_the_exporter_installs_and_runs_alone(wheel, tmp_path):
    """`pip install gpufleet` on a GPU node: the exporter's two dependencies and nothing heavy;
    `gpufleet exporter` serves metrics; the other subcommands name the extra to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                               capture_output=True, text=True, check=True).stdout.lower()
    names = {line.split("==")[0].replace("_", "-") for line in installed.split()}
    assert {"gpufleet", "prometheus-client", "nvidia-ml-py"} <= names
    assert not names & {h.lower() for h in HEAVY}, names
    for h in HEAVY:
        assert subprocess.run([str(py), "-c", f"import {h}"], capture_output=True).returncode != 0, f"{h} importable in the exporter venv"

    gpufleet = venv / "bin" / "gpufleet"
    version = subprocess.run([str(gpufleet), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip().startswith("gpufleet ") and version.stdout.split()[1][0].isdigit()
    for command, extra in (("collect", "collector"), ("analyze", "collector"), ("dashboard", "dashboards"), ("report", "report")):
        r = subprocess.run([str(gpufleet), command, "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pip install 'gpufleet[{extra}]'" in lines[0], (command, r.stderr)

    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([str(gpufleet), "exporter", "--backend", "sim", "--sim-gpus", "2", "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path)
    try:
        seen = {"body": ""}

        def two_gpus_served() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                seen["body"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return False
            return seen["body"].count("DCGM_FI_DEV_GPU_UTIL{") == 2

        wait_for("the exporter serves two simulated GPUs", two_gpus_served, timeout=60)
        body = seen["body"]
        assert f'gpufleet_build_info{{version="{version.stdout.split()[1]}",backend="sim"' in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_job_api_is_standard_library_only():
    """Jobs import (or copy) gpufleet/exporter/jobreport.py into their own environments: it may
    import nothing but the standard library, not even the rest of gpufleet."""
    path = ROOT / "exporter" / "jobreport.py"
    foreign = sorted({name for _, name in _imports(path) if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}})
    assert foreign == []
