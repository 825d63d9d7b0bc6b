"""The real-component harness works: each component answers with values we can assert.

Also pins down what Slurm puts in SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES / scontrol's IDX when
device minor numbers differ from positions (see tests/realstack/slurm.py): Slurm's index.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from tests.realstack.process import wait_for

pytestmark = pytest.mark.realstack


def test_prometheus_scrapes_itself(prometheus_factory):
    prom = prometheus_factory()  # default config: scrape itself every second
    result = prom.wait_query('up{job="prometheus"}', timeout=30)
    assert len(result) == 1
    assert result[0]["metric"]["instance"] == prom.address
    assert result[0]["value"][1] == "1"
    assert prom.query("1 + 1")[0][1] == "2"


def test_promtool_and_amtool_run(promtool, amtool):
    out = subprocess.run([promtool, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert "promtool, version 2." in out.stdout + out.stderr
    out = subprocess.run([amtool, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert "amtool, version 0." in out.stdout + out.stderr


def test_alertmanager_accepts_an_alert(alertmanager_factory):
    am = alertmanager_factory()
    assert am.alerts() == []
    am.post_alerts([{"labels": {"alertname": "GpuFellOffTheBus", "Hostname": "node1", "gpu": "3"}}])
    names = [a["labels"]["alertname"] for a in am.alerts()]
    assert names == ["GpuFellOffTheBus"]


def test_slurm_brought_up_quickly(slurm_cluster):
    assert slurm_cluster.startup_seconds is not None
    assert slurm_cluster.startup_seconds < 120
    node = slurm_cluster.run("scontrol", "show", "node", slurm_cluster.host)
    assert "Gres=gpu:h100:8" in node
    assert "gres/gpu=8" in node
    gres_conf = slurm_cluster.gres_conf.read_text()
    for gpu in slurm_cluster.gpus:
        assert f"File={gpu.path}\n" in gres_conf
        st = os.stat(gpu.path)
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, gpu.minor)
    assert [g.minor for g in slurm_cluster.gpus] != list(range(8))


def test_slurm_accounting_records_account_and_gpus(slurm_cluster):
    job = slurm_cluster.sbatch("echo hello from $SLURM_JOB_ID\n", account="physics", gpus=2)
    assert slurm_cluster.wait_job(job, timeout=60) == "COMPLETED"
    assert slurm_cluster.job_output(job).strip() == f"hello from {job}"
    out = slurm_cluster.sacct("-X", "-P", "-n", "-j", str(job), "-o", "JobID,Account,AllocTRES,State")
    job_id, account, tres, state = out.strip().split("|")
    assert (job_id, account, state) == (str(job), "physics", "COMPLETED")
    assert "gres/gpu=2" in tres.split(",")


def test_slurm_rejects_an_unknown_account(slurm_cluster):
    from tests.realstack.process import HarnessError

    with pytest.raises(HarnessError, match="Invalid account"):
        slurm_cluster.sbatch("true\n", account="no-such-team", gpus=1)


def _output(cluster, job: int) -> str:
    """The job's output so far ("" before slurmd creates the file)."""
    try:
        return cluster.job_output(job)
    except FileNotFoundError:
        return ""


def test_slurm_reports_gpu_index_not_minor(slurm_cluster):
    """scontrol IDX, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES: all Slurm's index, not the minor."""
    hook_marker = slurm_cluster.workdir / "hook-ran"
    slurm_cluster.add_hook("prolog", "10-touch", f'echo "$SLURM_JOB_ID $SLURM_JOB_GPUS" >> {hook_marker}\n')
    try:
        job = slurm_cluster.sbatch(
            'echo "JOB_GPUS=$SLURM_JOB_GPUS CUDA=$CUDA_VISIBLE_DEVICES"\nsleep 60\n', account="biology", gpus=2
        )
        slurm_cluster.wait_running(job)
        detail = slurm_cluster.scontrol_show_job_d(job)
        assert "(IDX:" in detail
        idx = slurm_cluster.gres_idx(job)
        assert len(idx) == 2 and all(0 <= i < 8 for i in idx)

        env = slurm_cluster.hook_env(job, "prolog")
        assert env["SLURM_JOB_ID"] == str(job)
        assert env["SLURM_JOB_ACCOUNT"] == "biology"
        assert env["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd"
        assert "SLURM_JOB_GPUS" in env
        as_list = [int(x) for x in env["SLURM_JOB_GPUS"].split(",")]
        assert as_list == idx  # Slurm's index ...
        minors = [slurm_cluster.gpus[i].minor for i in idx]
        assert as_list != minors  # ... not the minor number of the devices it allocated
        assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_JOB_GPUS"]
        assert slurm_cluster.hook_status(job, "prolog") == {"10-touch": 0}
        assert f"{job} {env['SLURM_JOB_GPUS']}" in hook_marker.read_text().splitlines()

        # RUNNING is before the batch script's first line: cancelled sooner, the job has not
        # written it yet (seen once on a loaded machine)
        wait_for(f"job {job}'s first output line", lambda: "JOB_GPUS=" in _output(slurm_cluster, job), timeout=30)
        slurm_cluster.run("scancel", str(job))
        assert slurm_cluster.wait_job(job).startswith("CANCELLED")
        ids = ",".join(map(str, idx))
        assert slurm_cluster.job_output(job).splitlines()[0] == f"JOB_GPUS={ids} CUDA={ids}"
        assert slurm_cluster.hook_env(job, "epilog")["SLURM_JOB_GPUS"] == ids
    finally:
        slurm_cluster.remove_hook("prolog", "10-touch")
