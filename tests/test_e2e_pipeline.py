"""Issue #8: the whole pipeline end to end, every component real, on loopback.

  Slurm      a real single-node cluster with accounting (tests/realstack/slurm.py: slurmctld, slurmd,
             slurmdbd, MariaDB, munge; 8 fake GPUs in gres.conf) running the shipped
             compose/node/slurm prolog/epilog, exactly as test_slurm_jobmap_real.py installs them.
  exporter   `gpufleet exporter --backend sim` (1 s polls) whose scenario has a `control_dir`: a job
             script drives its own GPUs by writing <control_dir>/<NVML index>.toml.
  Prometheus scrapes the exporter every second with the project's rules, built by alerts/build.py
             with short `for:` durations (--set idle_for=20s ...; the shipped ones are 1 h / 30 min).
  collector  `gpufleet collect` (the service: scrape every 1 s, sacct every 10 s) while the jobs
             run, then `gpufleet collect --once` after they ended (their final sacct records).
  analytics  `gpufleet analyze --format json` and `gpufleet report --no-pdf`, with
             [analytics] idle_min_duration_seconds = 30 instead of the default 30 min, so that a
             one-minute job can hold an idle stretch that counts.

Three jobs from two accounts, all started together and released together after RUN_S seconds:

  A  alpha  2 GPUs  busy:     utilization 90, one process per GPU
  B  beta   2 GPUs  idle:     utilization 0, one process per GPU (a process that computes nothing)
  C  beta   1 GPU   held:     utilization 0, no process

Each job script finds its own GPUs without the prolog: CUDA_VISIBLE_DEVICES holds Slurm's GRES
indices (positions in gres.conf), the script is given the gres.conf device list, stat()s the device
for its minor number and looks the minor up in the exporter's device map (index minor uuid ...).
The scenario numbers the GPUs so that GRES index, minor and NVML index differ for every GPU
(NVML index j has minor minors[7 - j]), so if the prolog labelled the wrong GPUs, the utilization
the analytics attributes to a job would not be the one its script set.

What must hold:
  - per job: utilization ~ what the script set, idle GPU-hours ~ GPUs x elapsed (B and C), none for A;
  - per account: allocated GPU-hours == sum over `sacct -X` rows of gres/gpu (AllocTRES) x ElapsedRaw,
    read here with a plain split (the oracle shares no code with the collector);
  - Prometheus: GpuAllocatedIdle firing for both of B's GPUs, GpuAllocatedNoProcess only for C,
    nothing ever (not even pending) for A;
  - the report lists B first among the most wasteful jobs (B: 2 GPUs idle > C: 1 GPU idle);
  - after tear-down no process of this test is left (daemons, slurmstepd, job scripts).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.realstack.process import free_port, wait_for
from tests.realstack.prometheus import start_prometheus
from tests.realstack.slurm import MARKER_KEY, start_slurm
from gpufleet.times import utcnow

pytestmark = pytest.mark.realstack
log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "compose" / "node" / "slurm"
CLUSTER = "gpufleet"  # the harness's ClusterName; also the collector's cluster label
HOST = "e2e-node"  # the exporter's Hostname label
RUN_S = 60  # every job runs at least this long (and until the idle alerts fired)
IDLE_MIN_S = 30  # [analytics] idle_min_duration_seconds for this test (default 1800)
RULE_SETTINGS = ("idle_for=20s", "no_process_for=20s", "gap_tolerance=3s")
# Before a job's script has written its control file the GPU shows the scenario's default (0 %, no
# process): Slurm's start (whole seconds, up to 1 s early) + prolog and script start (<1 s) +
# the exporter's poll (1 s) + the collector's scrape (1 s), ~4 s, doubled for a loaded CI machine.
# A busy job loses at most this much of its 90 % at the start; its end is clean (its samples
# after the end belong to no job).
EDGE_S = 8.0
# An idle stretch begins and ends where the allocation does, give or take one sample phase.
SAMPLE_SLACK_S = 2.0

# name: (account, GPUs, control file text; $$ is the job script's pid)
JOBS = {
    "A": ("alpha", 2, "utilization = 90\nprocesses = [ { pid = $$, used_memory_mib = 60000, sm_util = 90 } ]\n"),
    "B": ("beta", 2, "utilization = 0\nprocesses = [ { pid = $$, used_memory_mib = 20000, sm_util = 0 } ]\n"),
    "C": ("beta", 1, "utilization = 0\nprocesses = []\n"),
}
BUSY_PCT = 90.0

JOB_SCRIPT = """\
#!/bin/bash
# gpufleet e2e job {name}: drive this job's GPUs in the simulated exporter, then wait for release.
set -eu
devices=({devices})   # gres.conf order: Slurm's GPU index i is devices[i]
mine=()
for i in ${{CUDA_VISIBLE_DEVICES//,/ }}; do
    minor=$(( 16#$(stat -L -c %T "${{devices[$i]}}") ))
    nvml=$(awk -v m="$minor" '$1 !~ /^#/ && $2 == m {{ print $1 }}' "{devmap}")
    [ -n "$nvml" ] || {{ echo "no NVML index for minor $minor" >&2; exit 3; }}
    mine+=("$nvml")
done
trap 'for n in "${{mine[@]}}"; do rm -f "{control}/$n.toml"; done' EXIT
for n in "${{mine[@]}}"; do
    cat > "{control}/.$n.tmp" <<EOF
{control_text}EOF
    mv -f "{control}/.$n.tmp" "{control}/$n.toml"
done
echo "gres=$CUDA_VISIBLE_DEVICES nvml=${{mine[*]}}"
while [ ! -e "{release}" ] && [ "$SECONDS" -lt 600 ]; do sleep 0.5; done
"""


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def gpufleet(*args: str, timeout: float = 120) -> str:
    """Run the `gpufleet` CLI of this checkout; its stdout (stderr in the failure message)."""
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"gpufleet {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}"
    return r.stdout


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def sacct_rows(cluster) -> dict[str, dict]:
    """Every job allocation in the cluster's accounting, read with a plain split and nothing of ours:
    {JobIDRaw: account, gpus (gres/gpu of AllocTRES), elapsed (ElapsedRaw s), start, end (epoch), state}."""
    env = {**cluster.command_env(), "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    out = subprocess.run(
        ["sacct", "-X", "-P", "--noheader", "--allusers", "--starttime=now-1days", "--endtime=now",
         "-o", "JobIDRaw,Account,AllocTRES,ElapsedRaw,Start,End,State"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        raw, account, alloc, elapsed, start, end, state = line.split("|")
        m = re.search(r"(?:^|,)gres/gpu=(\d+)(?:,|$)", alloc)
        rows[raw] = {"account": account, "gpus": int(m[1]) if m else 0, "elapsed": int(elapsed),
                     "start": int(start), "end": int(end) if end.isdigit() else None, "state": state.split()[0]}
    return rows


class _WastefulJobs(HTMLParser):
    """The job ids of <table id="wasteful-jobs">, in row order (the <td class="id"> of each row)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self._in_table = self._in_id = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") == "wasteful-jobs":
            self._in_table = True
        elif self._in_table and tag == "td" and a.get("class") == "id":
            self._in_id = True
            self.ids.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag == "td":
            self._in_id = False

    def handle_data(self, data):
        if self._in_id:
            self.ids[-1] += data.strip()


def text_table_ids(text: str, heading: str) -> list[str]:
    """First-column values of the table under `heading` in report.txt (header and rule lines skipped)."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(heading))
    ids, started = [], False
    for ln in lines[i + 1:]:
        if not ln.strip():
            if started:
                break
            continue
        started = True
        first = ln.split()[0]
        if first.isdigit():
            ids.append(first)
    return ids


def our_processes(marker: str, needles: list[str], pids: list[int]) -> list[str]:
    """Live processes that belong to this test: one of `pids`, a cmdline naming one of `needles`
    (our temp dirs), or an environment holding the Slurm harness's marker entry."""
    found, me = [], os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (entry / "environ").read_bytes().split(b"\0")
            st = (entry / "stat").read_text()
        except OSError:
            continue
        if st.rsplit(")", 1)[1].split()[0] == "Z":
            continue  # a zombie has released everything; its parent reaps it
        if int(entry.name) in pids or any(n in cmd for n in needles) or marker.encode() in env:
            found.append(f"{entry.name} {cmd}")
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run the whole pipeline once, tear it all down, and hand the tests what was observed."""
    tmp = tmp_path_factory.mktemp("e2e")
    seen: dict = {"tmp": tmp}
    t_begin = time.monotonic()
    pids: list[int] = []
    with ExitStack() as stack:
        # ---- Slurm with two accounts, the shipped prolog/epilog hooked in
        cluster = start_slurm(tmp / "slurm", accounts=("alpha", "beta"))
        stack.callback(cluster.stop)
        pids += [d.pid for d in cluster.daemons]
        seen["marker"] = f"{MARKER_KEY}={cluster.workdir}"  # every daemon, slurmstepd and job process carries it
        seen["slurm_up_s"] = cluster.startup_seconds

        # ---- the simulated exporter: NVML index j has minor minors[7 - j]
        minors = list(reversed(cluster.minors))
        control, jobmap, devmap = tmp / "sim-control", tmp / "job-mapping", tmp / "gpu-devices.tsv"
        control.mkdir()
        jobmap.mkdir()
        (tmp / "scenario.toml").write_text(
            f'hostname = "{HOST}"\nmodel = "h100"\ngpus = {len(minors)}\nminor_numbers = {minors}\ncontrol_dir = "{control}"\n')
        (tmp / "exporter.toml").write_text(
            "[exporter]\npoll_interval = 1.0\nprocess_interval = 1.0\ncgroup_mapping = false\nkubelet_socket = \"\"\n"
            f'job_report_dir = ""\njob_map_dir = "{jobmap}"\ndevice_map_file = "{devmap}"\n')
        exporter_port = free_port()
        exporter = spawn([sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(tmp / "exporter.toml"), "--backend", "sim",
                          "--sim-scenario", str(tmp / "scenario.toml"), "--listen", f"127.0.0.1:{exporter_port}"], tmp / "exporter.log")
        stack.callback(terminate, exporter)
        pids.append(exporter.pid)
        wait_for("the exporter serving 8 GPUs and its device map",
                 lambda: exporter.poll() is None and http_text(f"http://127.0.0.1:{exporter_port}/metrics").count("DCGM_FI_DEV_GPU_UTIL{") == 8
                 and devmap.exists(), timeout=30)
        assert exporter.poll() is None, (tmp / "exporter.log").read_text()[-2000:]

        kit = tmp / "kit"
        shutil.copytree(KIT, kit)
        (kit / "node.conf").write_text(f"JOB_MAP_DIR={jobmap}\nDEVICE_MAP={devmap}\n")
        for kind in ("prolog", "epilog"):  # PATH unset: as slurmd runs a prolog
            cluster.add_hook(kind, "50-gpufleet-jobmap", f"#!/bin/sh\nunset PATH\nexec {kit}/{kind}.sh\n")

        # ---- Prometheus with the project's rules, short durations from build.py's own --set
        rules = tmp / "rules"
        r = subprocess.run([sys.executable, str(ROOT / "alerts" / "build.py"), "--out", str(rules),
                            *(a for s in RULE_SETTINGS for a in ("--set", s))], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        prom = start_prometheus(
            tmp / "prometheus",
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels:\n    cluster: e2e\n"
            f"scrape_configs:\n  - job_name: gpufleet-exporter\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n",
            rule_files=sorted(rules.glob("*.rules.yml")),
        )
        stack.callback(prom.stop)
        pids.append(prom.daemon.pid)
        prom.wait_query("gpufleet:gpu_utilization:ratio", timeout=60, min_results=8)

        # ---- the collector service
        store, collector_port = tmp / "store", free_port()
        config = tmp / "gpufleet.toml"
        config.write_text(
            f'[collector]\nstore = "{store}"\ncluster = "{CLUSTER}"\nlisten = "127.0.0.1:{collector_port}"\n'
            f'[collector.scrape]\ninterval = 1\ntimeout = 5\ntargets = ["127.0.0.1:{exporter_port}"]\n'
            f'[collector.sacct]\nenabled = true\ninterval = 10\nslurm_conf = "{cluster.slurm_conf}"\ninitial_lookback_seconds = 3600\n'
            f"[analytics]\nidle_min_duration_seconds = {IDLE_MIN_S}\n"
            '[report]\npdf = false\ntop_jobs = 5\n[report.schedule]\nenabled = false\n')
        collector = spawn([sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(config)], tmp / "collector.log")
        stack.callback(terminate, collector)
        pids.append(collector.pid)

        def collecting() -> bool:
            assert collector.poll() is None, (tmp / "collector.log").read_text()[-3000:]
            m = http_text(f"http://127.0.0.1:{collector_port}/metrics")
            return all(f'gpufleet_collect_source_success{{source="{s}"}} 1.0' in m for s in ("scrape", "sacct"))

        wait_for("the collector's scrape and sacct sources to succeed", collecting, timeout=60, interval=0.5)
        t0 = utcnow().replace(microsecond=0)

        # ---- the jobs
        release = cluster.jobs_dir / "release"
        devices = " ".join(cluster.device_files)
        ids = {}
        for name, (account, gpus, control_text) in JOBS.items():
            script = JOB_SCRIPT.format(name=name, devices=devices, devmap=devmap, control=control, control_text=control_text, release=release)
            ids[name] = cluster.sbatch(script, account=account, gpus=gpus, extra_args=[f"--job-name=e2e-{name}"])
        seen["ids"] = ids
        for j in ids.values():
            cluster.wait_running(j, timeout=60)
        started = time.monotonic()

        # the idle job's GPUs alert in Prometheus while it runs
        def firing(alertname: str) -> set[tuple[str, str]]:
            return {(a["metric"].get("job_id", ""), a["metric"]["gpu"])
                    for a in prom.query(f'ALERTS{{alertname="{alertname}", alertstate="firing"}}')}

        def alerts_fired() -> bool:
            return {jid for jid, _ in firing("GpuAllocatedIdle")} >= {str(ids["B"]), str(ids["C"])} and \
                   {jid for jid, _ in firing("GpuAllocatedNoProcess")} >= {str(ids["C"])}

        wait_for("GpuAllocatedIdle (B, C) and GpuAllocatedNoProcess (C) firing", alerts_fired, timeout=120, interval=0.5)
        seen["alert_after_s"] = time.monotonic() - started
        seen["idle_firing"], seen["noproc_firing"] = firing("GpuAllocatedIdle"), firing("GpuAllocatedNoProcess")
        seen["job_info"] = {(x["metric"]["job_id"], x["metric"]["gpu"]) for x in prom.query("gpufleet_gpu_job_info")}
        seen["alert_rows"] = [a["labels"] for a in prom.alerts()]
        seen["prom_job_util"] = {x["metric"]["job_id"]: float(x["value"][1]) for x in prom.query("gpufleet:job_utilization:ratio")}

        time.sleep(max(0.0, RUN_S - (time.monotonic() - started)))
        release.touch()
        seen["states"] = {name: cluster.wait_job(j, timeout=60) for name, j in ids.items()}
        ended = time.time()
        # everything A ever did in Prometheus: not one ALERTS sample (pending or firing) in the run
        seen["alerts_for_a"] = prom.query(f'count_over_time(ALERTS{{job_id="{ids["A"]}"}}[10m])')
        seen["outputs"] = {name: cluster.job_output(j) for name, j in ids.items()}
        seen["hooks"] = {name: (cluster.hook_status(j, "prolog"), cluster.hook_status(j, "epilog")) for name, j in ids.items()}
        seen["jobmap_left"] = sorted(p.name for p in jobmap.iterdir())
        seen["control_left"] = sorted(p.name for p in control.iterdir())

        # ---- ingest: stop the service (one writer), then one pass for the final sacct records
        def scraped_after_the_end() -> bool:  # a couple of the collector's scrapes (1 s apart) after the jobs ended
            done = [s.value for f in text_string_to_metric_families(http_text(f"http://127.0.0.1:{collector_port}/metrics"))
                    for s in f.samples if s.name == "gpufleet_collect_source_last_success_timestamp_seconds" and s.labels == {"source": "scrape"}]
            return bool(done) and done[0] >= ended + 2

        wait_for("the collector to scrape twice after the jobs ended", scraped_after_the_end, timeout=60, interval=0.25)
        terminate(collector)
        assert collector.returncode == 0, (tmp / "collector.log").read_text()[-3000:]
        gpufleet("collect", "--once", "--config", str(config))
        seen["sacct"] = sacct_rows(cluster)
        t1 = utcnow().replace(microsecond=0)
        seen["window"] = (t0 - timedelta(seconds=30), t1)

        # ---- analytics and the report (they need no daemon)
        frm, to = iso(seen["window"][0]), iso(seen["window"][1])
        seen["by_job"] = json.loads(gpufleet("analyze", "--config", str(config), "--from", frm, "--to", to, "--by", "job",
                                             "--format", "json", "--job", str(ids["C"])))
        seen["by_account"] = json.loads(gpufleet("analyze", "--config", str(config), "--from", frm, "--to", to, "--by", "account",
                                                 "--format", "json"))
        gpufleet("report", "--config", str(config), "--from", frm, "--to", to, "--out", str(tmp / "report"), "--no-pdf", "--quiet")
        seen["report_txt"] = next((tmp / "report").glob("*.txt")).read_text()
        seen["report_html"] = next((tmp / "report").glob("*.html")).read_text()
        seen["before_teardown_s"] = time.monotonic() - t_begin
    # ---- all torn down (ExitStack, in reverse): what is left of us?
    seen["teardown_s"] = time.monotonic() - t_begin - seen["before_teardown_s"]
    deadline = time.monotonic() + 10
    while (left := our_processes(seen["marker"], [str(tmp)], pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    seen["left"] = left
    seen["total_s"] = time.monotonic() - t_begin
    log.info("e2e: slurm up %.1fs, alerts after %.1fs, before teardown %.1fs, teardown %.1fs, total %.1fs",
             seen["slurm_up_s"], seen["alert_after_s"], seen["before_teardown_s"], seen["teardown_s"], seen["total_s"])
    return seen


def job_row(rows: list[dict], job_id: int) -> dict:
    (row,) = [r for r in rows if r["job_id"] == str(job_id)]
    return row


def test_jobs_ran_as_submitted_and_the_prolog_mapped_what_each_job_drove(run):
    ids, sacct = run["ids"], run["sacct"]
    assert run["states"] == {"A": "COMPLETED", "B": "COMPLETED", "C": "COMPLETED"}
    # the fresh cluster ran exactly our three jobs, with the accounts and GPUs asked for
    assert sorted(sacct) == sorted(str(j) for j in ids.values())
    for name, (account, gpus, _) in JOBS.items():
        row = sacct[str(ids[name])]
        assert (row["account"], row["gpus"], row["state"]) == (account, gpus, "COMPLETED")
        assert row["elapsed"] == row["end"] - row["start"] >= RUN_S
        # the shipped prolog and epilog ran for every job
        assert run["hooks"][name] == ({"50-gpufleet-jobmap": 0}, {"50-gpufleet-jobmap": 0})
    # each script's own translation (GRES index -> gres.conf device -> minor -> device map) names
    # the GPUs that Prometheus saw labelled with that job through the prolog's job-mapping files
    for name, j in ids.items():
        m = re.search(r"gres=(\S+) nvml=(.*)", run["outputs"][name])
        assert m, run["outputs"][name]
        gres, nvml = m[1].split(","), m[2].split()
        assert len(nvml) == JOBS[name][1] == len(gres)
        assert {g for jid, g in run["job_info"] if jid == str(j)} == set(nvml)
        assert set(nvml) != set(gres), "GRES index and NVML index coincide: the test would not see a mix-up"
    # after the jobs: the epilog emptied the mapping, the job scripts removed their control files
    assert run["jobmap_left"] == [".lock"]
    assert run["control_left"] == []


def test_prometheus_fires_the_idle_alert_for_the_idle_job(run):
    ids = run["ids"]
    b_gpus = {g for jid, g in run["job_info"] if jid == str(ids["B"])}
    c_gpus = {g for jid, g in run["job_info"] if jid == str(ids["C"])}
    # GpuAllocatedIdle (util < 5 % for idle_for) fires on both of B's GPUs; C holds a 0 % GPU too
    assert {g for jid, g in run["idle_firing"] if jid == str(ids["B"])} == b_gpus and len(b_gpus) == 2
    assert {jid for jid, _ in run["idle_firing"]} == {str(ids["B"]), str(ids["C"])}
    # GpuAllocatedNoProcess only on C's GPU: B's GPUs have a process, A's too
    assert run["noproc_firing"] == {(str(ids["C"]), g) for g in c_gpus}
    b_alert = next(a for a in run["alert_rows"] if a["alertname"] == "GpuAllocatedIdle" and a["job_id"] == str(ids["B"]))
    assert (b_alert["Hostname"], b_alert["scheduler"], b_alert["severity"], b_alert["category"]) == (HOST, "slurm", "warning", "waste")
    # the busy job never had an alert, not even pending, during the whole run
    assert run["alerts_for_a"] == []
    # and Prometheus' own per-job utilization says what the scripts set (0.90, 0, 0)
    assert run["prom_job_util"][str(ids["A"])] == pytest.approx(BUSY_PCT / 100)
    assert run["prom_job_util"][str(ids["B"])] == 0 and run["prom_job_util"][str(ids["C"])] == 0


def test_per_job_utilization_and_idle_gpu_hours_match_what_the_jobs_did(run):
    ids, sacct, report = run["ids"], run["sacct"], run["by_job"]
    assert report["parameters"]["idle_min_duration_s"] == IDLE_MIN_S
    rows = report["utilization"]["rows"]
    elapsed = {name: sacct[str(j)]["elapsed"] for name, j in ids.items()}

    # A: 90 % for its whole run but the first few seconds (the default 0 % until its control file
    # is read and scraped): between 90 x (elapsed - EDGE_S) / elapsed and 90
    a = job_row(rows, ids["A"])
    log.info("e2e measured: elapsed %s; util A %.2f%% B %s C %s; idle GPU-s %s; top %s", elapsed, a["utilization_pct"],
             job_row(rows, ids["B"])["utilization_pct"], job_row(rows, ids["C"])["utilization_pct"],
             {r["job_id"]: round(r["idle_gpu_h"] * 3600, 1) for r in report["top_wasteful_jobs"]},
             [r["job_id"] for r in report["top_wasteful_jobs"]])
    low = BUSY_PCT * (elapsed["A"] - EDGE_S) / elapsed["A"]  # e.g. 90 x 53/61 = 78.2 (measured: 86.9-88.4)
    assert low <= a["utilization_pct"] <= BUSY_PCT + 1e-9, (a["utilization_pct"], low)
    # B and C: 0 % throughout
    assert job_row(rows, ids["B"])["utilization_pct"] == 0
    assert job_row(rows, ids["C"])["utilization_pct"] == 0

    # idle GPU-hours: B 2 GPUs x elapsed, C 1 GPU x elapsed (one idle stretch per GPU, the whole
    # allocation); A none (its idle start, < EDGE_S, is far below idle_min_duration)
    top = {r["job_id"]: r for r in report["top_wasteful_jobs"]}
    assert set(top) == {str(ids["B"]), str(ids["C"])}
    for name in ("B", "C"):
        gpus, want_h = JOBS[name][1], JOBS[name][1] * elapsed[name] / 3600  # B: 2 x 61 / 3600 = 0.0339 GPU-h
        got_h = top[str(ids[name])]["idle_gpu_h"]
        assert got_h == pytest.approx(want_h, abs=gpus * SAMPLE_SLACK_S / 3600), (name, got_h * 3600, elapsed[name])
        assert top[str(ids[name])]["idle_gpus"] == gpus
    # B (2 GPUs idle) wastes more than C (1 GPU): first in the ranking
    assert [r["job_id"] for r in report["top_wasteful_jobs"]] == [str(ids["B"]), str(ids["C"])]

    # C held its GPU with no process the whole time: that verdict wins over "idle"
    c = report["job"]
    assert c["verdict"] == "no_process"
    assert c["no_process_gpu_h"] == pytest.approx(elapsed["C"] / 3600, abs=SAMPLE_SLACK_S / 3600)


def test_allocated_gpu_hours_per_account_equal_slurm_accounting(run):
    # the oracle: sum over sacct -X rows of gres/gpu x ElapsedRaw, per account, by hand
    want: dict[str, int] = {}
    for row in run["sacct"].values():
        want[row["account"]] = want.get(row["account"], 0) + row["gpus"] * row["elapsed"]
    assert set(want) == {"alpha", "beta"}  # alpha: 2 x ~61 s; beta: 2 x ~61 + 1 x ~61 s
    got = {r["account"]: r["allocated_gpu_h"] * 3600 for r in run["by_account"]["utilization"]["rows"]}
    log.info("e2e measured: allocated GPU-s per account: analytics %s, sacct %s", got, want)
    assert got == pytest.approx({k: float(v) for k, v in want.items()}, abs=1e-6)
    assert run["by_account"]["totals"]["allocated_gpu_h"] * 3600 == pytest.approx(sum(want.values()), abs=1e-6)
    # and per job, to the second
    by_job = run["by_job"]["utilization"]["rows"]
    for name, j in run["ids"].items():
        row = run["sacct"][str(j)]
        assert job_row(by_job, j)["allocated_gpu_h"] * 3600 == pytest.approx(row["gpus"] * row["elapsed"], abs=1e-6)


def test_the_report_names_the_idle_job_as_the_top_waste(run):
    ids = run["ids"]
    html = _WastefulJobs()
    html.feed(run["report_html"])
    assert html.ids == [str(ids["B"]), str(ids["C"])]
    assert text_table_ids(run["report_txt"], "THE 5 MOST WASTEFUL JOBS") == [str(ids["B"]), str(ids["C"])]
    assert text_table_ids(run["report_txt"], "JOBS THAT HELD GPUS WITH NO PROCESS") == [str(ids["C"])]


def test_nothing_is_left_running(run):
    assert run["left"] == []
    # and the run fits comfortably in CI's limit
    assert run["total_s"] < 300, run["total_s"]
