"""Lemon nodes through `gpufleet policy`: proposed for draining in a dry run, exempted by
[policy] exempt_nodes, drained with `scontrol update ... State=DRAIN Reason="gpufleet: ..."` only
under enforce, audited, and not drained twice within renotify_after."""

from __future__ import annotations

import json
import shlex
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.config import load_file
from gpufleet.policy.enforce import Runner
from tests.support.fleet import Fleet
from tests.support.policy_config import policy_toml
from tests.test_policy_actions import recorder

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
H = timedelta(hours=1)


@pytest.fixture
def store(tmp_path):
    """20 single-GPU nodes each held 100 h in the week; node "bad" also ran 4 one-hour jobs that
    ended NODE_FAIL: 4 failures where the fleet's rate expects 0.21 (P = 6e-5 < 1 % / 20 nodes)."""
    f = Fleet(tmp_path / "store", cluster="hpc")
    for i in range(19):
        f.job(f"{100 + i}", account="ml", user="ann", start=AS_OF - 120 * H, end=AS_OF - 20 * H, gpus=1,
              placements=[(f"n{i:02d}", f"GPU-{i}")], state="COMPLETED", exit_code="0:0")
    f.job("200", account="ml", user="ann", start=AS_OF - 120 * H, end=AS_OF - 20 * H, gpus=1, placements=[("bad", "GPU-bad")],
          state="COMPLETED", exit_code="0:0")
    for k in range(4):
        f.job(f"{300 + k}", account="ml", user="bo", start=AS_OF - (10 - 2 * k) * H, end=AS_OF - (9 - 2 * k) * H, gpus=1,
              placements=[("bad", "GPU-bad")], state="NODE_FAIL", state_raw="NODE_FAIL")
    f.write()
    return tmp_path / "store"


def config(tmp_path: Path, store: Path, *, enforce: bool, scontrol: str = "scontrol", exempt_nodes=()) -> Path:
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f'[collector]\ncluster = "hpc"\n[analytics]\nstore = "{store}"\n' + policy_toml(
        1, enforce=enforce, scontrol=scontrol, exempt_nodes=list(exempt_nodes), squeue="", retries=0))
    return cfg


def recording_scontrol(tmp_path: Path) -> tuple[str, Path]:
    """An executable that appends its argv (one per line, then a blank line) to a file: what
    scontrol would have been asked (the real one: tests/test_reliability_slurm_real.py)."""
    log = tmp_path / "scontrol.log"
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> {log}; done\necho >> {log}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), log


def test_dry_run_proposes_draining_the_lemon(tmp_path, store, capsys):
    cfg = config(tmp_path, store, enforce=True)
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [d] = doc["drains"]
    assert (d["node"], d["cluster"], d["scheduler"]) == ("bad", "hpc", "slurm")
    assert d["command"][:4] == ["scontrol", "update", "NodeName=bad", "State=DRAIN"]
    assert d["command"][4].startswith("Reason=gpufleet: lemon: 4 hardware/node failures in 104 GPU-h")
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z"]) == 0
    table = capsys.readouterr().out
    assert "drain?" in table  # --as-of: a dry run
    # the command as a shell takes it: the reason (spaces, colons) one argument
    [line] = [x.strip() for x in table.splitlines() if x.strip().startswith("scontrol ")]
    assert shlex.split(line) == d["command"]


def test_exempt_nodes(tmp_path, store, capsys):
    cfg = config(tmp_path, store, enforce=False, exempt_nodes=["ba*"])
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["drains"] == [] and [(d["node"], d["exempt_reason"]) for d in doc["drains_exempt"]] == [
        ("bad", "node matches exempt_nodes 'ba*'")]


def test_enforced_drain_is_audited_and_not_repeated(tmp_path, store):
    scontrol, log = recording_scontrol(tmp_path)
    cfg = config(tmp_path, store, enforce=True, scontrol=scontrol)
    r = Runner.from_config(load_file(cfg), cfg, clock=lambda: AS_OF, sleep=lambda s: None)
    assert r.execute_drains(r.drains(store, AS_OF)["drains"], recorder(store), dry_run=True) == []
    assert not log.exists()  # a dry run does nothing
    rows = r.execute_drains(r.drains(store, AS_OF)["drains"], recorder(store))
    assert [(x["job_key"], x["action"], x["result"]) for x in rows] == [("node:bad", "drain", "ok")]
    argv = log.read_text().split("\n")
    assert argv[:3] == ["update", "NodeName=bad", "State=DRAIN"] and argv[3].startswith("Reason=gpufleet: lemon: ")
    again = r.drains(store, AS_OF + H)
    assert again["drains"] == [] and [d.node for d in again["suppressed"]] == ["bad"]


def test_reliability_metrics_for_the_alert_rules(tmp_path, store):
    from prometheus_client import generate_latest

    cfg = config(tmp_path, store, enforce=False)
    r = Runner.from_config(load_file(cfg), cfg, clock=lambda: AS_OF, sleep=lambda s: None)
    r.publish_reliability(r.drains(store, AS_OF), r.recent_reliability(store, AS_OF))
    text = generate_latest(r.metrics.registry).decode()
    assert 'gpufleet_reliability_lemon_node{Hostname="bad",cluster="hpc",scheduler="slurm"} 1.0' in text
    # node failures are no hardware evidence: the hardware rate is a known 0 over both windows (GPU-hours were held)
    assert 'gpufleet_reliability_hardware_interruptions_per_1000_gpu_days{window="recent"} 0.0' in text
    assert 'gpufleet_reliability_hardware_interruptions_per_1000_gpu_days{window="baseline"} 0.0' in text


def test_a_node_s_exposure_and_scheduler_are_its_window_s_holds():
    """The lemon test's exposure per node (sql.RELIABILITY_HOST_GPU_HOURS): the GPU-hours held in
    the window, and the scheduler most of those holds are of - a node that Slurm held for weeks
    and Kubernetes holds now is drained as Kubernetes' (it was the history's majority before)."""
    import duckdb

    from gpufleet.analytics import sql
    from gpufleet.collector.schema import ALLOCATIONS_DDL, GPUS_DDL, JOB_ATTEMPTS_DDL, JOBS_DDL

    T0 = datetime(2026, 11, 2)
    con = duckdb.connect()
    for ddl in (JOBS_DDL, ALLOCATIONS_DDL, JOB_ATTEMPTS_DDL, GPUS_DDL):  # (no inventory row: the GPU counts whole)
        con.execute(ddl)
    rows = [("slurm", f"s{k}", T0 - timedelta(days=k + 1), T0 - timedelta(days=k + 1) + timedelta(hours=2)) for k in range(3)]
    rows += [("kubernetes", "ns/p0", T0 + timedelta(hours=1), T0 + timedelta(hours=3))]
    for scheduler, key, first, last in rows:
        con.execute("INSERT INTO allocations VALUES ('c', ?, ?, 'n1', 'GPU-0', -1, 0, ?, ?, 'exporter')", [scheduler, key, first, last])
    values = {"start": T0, "end": T0 + timedelta(days=1), "max_gap": 1800.0, "cluster": None, "account": None, "user_name": None,
              "partition": None, "job_keys": None, "seen_floor": None}
    q = sql.RELIABILITY_HOST_GPU_HOURS
    [(cluster, host, scheduler, gpu_hours)] = con.execute(q, sql.bound(q, values)).fetchall()
    assert (cluster, host, scheduler) == ("c", "n1", "kubernetes") and abs(gpu_hours - 2.5) < 1e-9  # (last sighting + max_gap)
