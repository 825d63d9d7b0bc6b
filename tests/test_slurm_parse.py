"""Slurm parsers against every sample in shared/data/slurm/ (real outputs of several Slurm
versions) and against the bad input a collector meets: misaligned lines, names holding the
delimiter, unknown states, garbage bytes, local times."""

from __future__ import annotations

import functools
import json
from datetime import datetime

import pytest

from gpufleet.collector.schema import JOB_COLUMNS
from gpufleet.collector.sources.slurm_parse import (
    MAX_PROBLEMS,
    alloc_tres_gpu_count,
    expand_hostlist,
    gres_gpus,
    parse_elapsed,
    parse_idx,
    parse_sacct,
    parse_scontrol_show_job_d,
    parse_time,
    tres_gpus,
)
from gpufleet.collector.sources.slurm_json import parse_slurmrestd_jobs
from tests.support.shared_data import SHARED_DATA, shared_json_params

DATA = SHARED_DATA / "slurm"
NOW = datetime(2026, 11, 20, 12, 0, 0)


@functools.cache
def xdmod_fields() -> list[str]:
    """XDMoD's sacct field list, read when a test needs it (a module-level read fails collection
    where ../shared is absent)."""
    return (DATA / "sacct" / "xdmod_FORMAT_header.txt").read_text().strip().split("|")


XDMOD_NODES = (
    "d07n07s02,d07n19s02,d07n25s01,d07n28s01,d07n29s01,d07n31s02,d07n38s02,d09n04s[01-02],d09n05s02,"
    "d09n06s01,d09n07s01,d09n08s[01-02],d09n09s01,d09n11s[01-02],d09n13s01,d09n14s01,d09n15s01,"
    "d09n16s01,d09n17s01,d09n24s01,d09n25s02,d09n28s01,d09n35s01,d09n38s02,d13n[03,05,07-08,16]"
)


def sacct_file(name: str, **kw):
    return parse_sacct((DATA / "sacct" / name).read_text(), now=NOW, **kw)


def pick(row: dict, *cols: str) -> tuple:
    return tuple(row[c] for c in cols)


# ---- sacct fixtures ----------------------------------------------------------------------------


def test_torchx_hetjob_three_components_steps_skipped():
    jobs, rejected, problems = sacct_file("torchx_sacct_parsable2_hetjob.psv")
    assert (rejected, problems) == (0, [])
    assert [pick(j, "job_key", "job_id", "het_job_id", "het_job_offset", "name", "state") for j in jobs] == [
        ("1853+0", "1853+0", "1853", 0, "echo-0", "COMPLETED"),
        ("1853+1", "1853+1", "1853", 1, "echo-1", "COMPLETED"),
        ("1853+2", "1853+2", "1853", 2, "echo-2", "COMPLETED"),
    ]
    for j in jobs:
        assert set(j) == set(JOB_COLUMNS)
        assert pick(j, "cluster", "scheduler", "source", "updated_at") == ("default", "slurm", "sacct", NOW)
        assert pick(j, "partition", "account", "exit_code", "array_job_id", "gpus") == ("compute", None, "0:0", None, None)


def test_torchx_failed_running_cancelled():
    jobs, rejected, problems = sacct_file("torchx_sacct_parsable2_failed_running_cancelled.psv", cluster="c1")
    assert (rejected, problems) == (0, [])
    assert [pick(j, "job_id", "name", "partition", "account", "state", "state_raw", "exit_code") for j in jobs] == [
        ("1902", "sh-0", "compute", None, "FAILED", "FAILED", "2:0"),
        ("54", "echo-echo-0", "compute", None, "RUNNING", "RUNNING", "0:0"),
        ("89", "mesh0-0", "all", "root", "CANCELLED", "CANCELLED by 2166", "0:0"),
    ]
    assert {j["cluster"] for j in jobs} == {"c1"}


def test_byte_order_mark_costs_no_record():
    """A file saved with a UTF-8 BOM: the header (or, with given fields, the first record) is still read."""
    name = "torchx_sacct_parsable2_failed_running_cancelled.psv"
    text = (DATA / "sacct" / name).read_text()
    for bom in ("\ufeff" + text, ("\ufeff" + text).encode("utf-8")):
        assert parse_sacct(bom, now=NOW) == sacct_file(name)
    xdmod = (DATA / "sacct" / "xdmod_unit_accounting-logs.psv").read_text()
    assert parse_sacct("\ufeff" + xdmod, fields=xdmod_fields(), now=NOW) == sacct_file("xdmod_unit_accounting-logs.psv", fields=xdmod_fields())


def test_xdmod_accounting_logs():
    jobs, rejected, problems = sacct_file("xdmod_unit_accounting-logs.psv", fields=xdmod_fields())
    assert (rejected, problems) == (0, [])
    by_id = {j["job_id"]: j for j in jobs}
    assert list(by_id) == ["4103947", "4107166", "4107219", "5692623"]

    j = by_id["4103947"]
    assert pick(j, "job_key", "state", "state_raw", "exit_code", "user_name", "account", "partition", "qos") == (
        "4103947", "TIMEOUT", "TIMEOUT", "1:0", "unknown", "anon", "general-compute", "qos")
    assert pick(j, "submit", "eligible", "start", "end") == (
        datetime(2015, 6, 26, 13, 57), datetime(2015, 6, 26, 13, 57),
        datetime(2015, 6, 28, 2, 55, 50), datetime(2015, 7, 1, 2, 55, 50))
    assert pick(j, "node_count", "nodes", "gpus", "gpu_type", "name") == (32, XDMOD_NODES, 0, None, "1AbC-2-3")
    assert j["alloc_tres"] == "billing=256,cpu=256,mem=3000M,node=32"

    j = by_id["4107166"]
    assert pick(j, "state", "state_raw", "user_name", "account", "node_count", "nodes", "name") == (
        "CANCELLED", "CANCELLED by 102216", "hanx", "dspumpkins", 3, "k10n26s01,k13n36s01,k13n37s01", "100-Floors-of-Frights")
    assert pick(j, "submit", "eligible", "end") == (
        datetime(2015, 6, 26, 19, 51, 25), datetime(2015, 6, 26, 19, 51, 26), datetime(2015, 7, 1, 13, 17, 53))

    j = by_id["4107219"]
    assert pick(j, "state", "exit_code", "gpus", "node_count", "start", "end") == (
        "COMPLETED", "0:0", 0, 4, datetime(2015, 6, 30, 12, 4, 4), datetime(2015, 7, 1, 2, 4, 53))

    j = by_id["5692623"]  # eligible Unknown, no partition, gres/gpu=2, NNodes 0 yet two nodes listed
    assert pick(j, "eligible", "partition", "gpus", "gpu_type", "alloc_tres", "node_count", "nodes", "name") == (
        None, None, 2, None, "gres/gpu=2", 0, "cpn-k16-35-01,cpn-k16-37-01", "allocation")
    assert j["submit"] == datetime(2016, 8, 1, 6, 1, 8)


def test_xdmod_job_arrays():
    jobs, rejected, problems = sacct_file("xdmod_unit_accounting-logs-with-job-arrays.psv", fields=xdmod_fields())
    assert (rejected, problems) == (0, [])
    assert [pick(j, "job_id", "array_job_id", "array_task_id") for j in jobs] == [
        ("4103947_100", "4103947", "100"),
        ("4103947_[1-3]", "4103947", "1-3"),  # a pending range stays ONE row, id as sacct wrote it
        ("4103947_[1,5]", "4103947", "1,5"),
        ("4103947_[9-11,20]", "4103947", "9-11,20"),
        ("4103947_[91,100-102]", "4103947", "91,100-102"),
        ("4103947_[9-11,13,16-20]", "4103947", "9-11,13,16-20"),
    ]
    # JobIDRaw is the key: this (--duplicates) file has every record under the array's raw id
    assert {j["job_key"] for j in jobs} == {"4103947"}
    assert {(j["state"], j["gpus"], j["alloc_tres"], j["het_job_id"]) for j in jobs} == {("TIMEOUT", None, None, None)}


@pytest.mark.parametrize("tres,expected", shared_json_params("slurm/sacct/xdmod_alloc-tres-gpu-count.json", 2))
def test_xdmod_alloc_tres_gpu_count(tres, expected):
    assert alloc_tres_gpu_count(tres) == expected


def test_tres_gpu_type_and_no_double_count():
    assert tres_gpus("billing=1,cpu=1,gres/gpu:p100=1,mem=125G,node=1") == (1, "p100")
    assert tres_gpus("cpu=2,gres/gpu=1,gres/gpu:a100=1,node=1") == (1, "a100")
    assert tres_gpus("gres/gpu:a100=2,gres/gpu:v100=1") == (3, "a100,v100")
    assert tres_gpus("cpu=4,gres/gpumem=40G,gres/gpuutil=90") == (None, None)
    assert tres_gpus("cpu=2,gres/gg=1,gres/gg:g0=1,gres/gpu=1,gres/gpu:rtx2080=1,license/interactive=1") == (1, "rtx2080")
    assert tres_gpus(None) == (None, None)


def test_gres_strings():
    assert gres_gpus("gpu:2") == (2, None, None)
    assert gres_gpus("gpu:tesla:2") == (2, "tesla", None)
    assert gres_gpus("gpu") == (1, None, None)
    assert gres_gpus("gpu(IDX:0,2-3,5)") == (4, None, [0, 2, 3, 5])
    assert gres_gpus("gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)") == (1, "rtx2080", [1])
    assert gres_gpus("gg:g0(CNT:1),gpu:1(IDX:3)") == (1, None, [3])
    assert gres_gpus("gpu:(null):2(IDX:0-1)") == (2, None, [0, 1])
    assert gres_gpus("gpu:h100:0(IDX:N/A)") == (0, "h100", [])
    assert gres_gpus("gpu:a100:4(S:0-3)") == (4, "a100", None)
    assert gres_gpus("gpu:1g.10gb:1(IDX:3)") == (1, "1g.10gb", [3])
    assert gres_gpus("gres/gpu:2,gres:gpu:1") == (3, None, None)
    assert gres_gpus("") == (None, None, None)
    assert parse_idx("0,2-3,5") == [0, 2, 3, 5]


def test_expand_hostlist():
    assert expand_hostlist("node[01-03,05]") == ["node01", "node02", "node03", "node05"]
    assert expand_hostlist("node-[63-65]") == ["node-63", "node-64", "node-65"]
    assert expand_hostlist("gpu7,gpu[8-10]") == ["gpu7", "gpu8", "gpu9", "gpu10"]
    assert expand_hostlist("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert expand_hostlist("node-005") == ["node-005"]
    assert expand_hostlist("") == [] and expand_hostlist(None) == []
    hosts = expand_hostlist(XDMOD_NODES)
    assert len(hosts) == 32 == len(set(hosts))  # the xdmod job says NNodes 32
    assert hosts[7:9] == ["d09n04s01", "d09n04s02"]
    assert hosts[-5:] == ["d13n03", "d13n05", "d13n07", "d13n08", "d13n16"]
    with pytest.raises(ValueError):
        expand_hostlist("n[a-b]")
    with pytest.raises(ValueError):
        expand_hostlist("n[1-99999999]")


# ---- scontrol show job -d ---------------------------------------------------------------------


def test_scontrol_show_job_d_every_record():
    recs = parse_scontrol_show_job_d((DATA / "scontrol" / "irush-cs_scontrol_show_job_-d_multi-version.txt").read_text())
    cols = ("job_key", "job_id", "array_job_id", "array_task_id", "name", "user_name", "account", "partition", "state",
            "nodes", "gres_idx", "gpus", "gpu_type")
    assert [pick(r, *cols) for r in recs] == [
        ("1", "1", None, None, "name1", "user1", "account1", "long", "RUNNING", "node-[63-65]", {}, 0, None),
        ("2398617", "2398463_150", "2398463", "150", "parallel.sh", "user2", "account1", "long", "COMPLETED",
         "node-44", {}, 0, None),
        # ~17.x/18.x: GRES_IDX=gpu(IDX:0,2-3,5)
        ("153291", "153291", None, None, "name3", "user3", "oabend", "medium", "RUNNING", "node-06",
         {"node-06": [0, 2, 3, 5]}, 4, None),
        ("134238037", "134238037", None, None, "wrap", "user3", "irush", "long,other", "PENDING", None, {}, 0, None),
        # 19.05: GRES=gpu(IDX:5)
        ("2423559", "2423430_72", "2423430", "72", "tsn", "user4", "account4", "short", "RUNNING", "cortex-08",
         {"cortex-08": [5]}, 1, None),
        ("20547", "20547", None, None, "test", "user5", "account5", "short,long,other", "PENDING", None, {}, 0, None),
        # truncated CPU_IDs, empty GRES=
        ("1306093", "1306093", None, None, "test_06112019.sh", "user6", "account6", "medium", "RUNNING", "node-12",
         {}, 0, None),
        # 20.x+: GRES=gg:g0(CNT:1),gpu:1(IDX:3) -- the non-GPU gres is ignored
        ("25686416", "25686416", None, None, "test", "user6", "account6", "interactive", "RUNNING", "node-005",
         {"node-005": [3]}, 1, None),
        ("25687666", "25687666", None, None, "test", "user6", "system", "interactive", "RUNNING", "node-001",
         {"node-001": [1]}, 1, "rtx2080"),
    ]


def test_scontrol_multi_node_het_and_pending_array():
    text = (
        "JobId=1854 HetJobId=1853 HetJobOffset=1 JobName=het part\n"
        "   UserId=alice(1000) GroupId=g(1) Account=physics QOS=normal\n   JobState=RUNNING Reason=None\n"
        "   NodeList=gpu[01-02,07]\n"
        "     Nodes=gpu[01-02] CPU_IDs=0-1 Mem=100 GRES=gpu:a100:2(IDX:0-1)\n"
        "     Nodes=gpu07 CPU_IDs=0 Mem=100 GRES=gpu:a100:1(IDX:6)\n\n"
        "JobId=500 ArrayJobId=500 ArrayTaskId=3-9%2 JobName=arr\n   JobState=PENDING Reason=Priority\n   NodeList=(null)\n"
    )
    het, arr = parse_scontrol_show_job_d(text)
    assert pick(het, "job_key", "job_id", "het_job_id", "het_job_offset", "name", "user_name", "gpus", "gpu_type") == (
        "1854", "1853+1", "1853", 1, "het part", "alice", 5, "a100")
    assert het["gres_idx"] == {"gpu01": [0, 1], "gpu02": [0, 1], "gpu07": [6]}
    assert pick(arr, "job_key", "job_id", "state", "nodes", "gpus") == ("500", "500_[3-9%2]", "PENDING", None, 0)


# ---- slurmrestd ----------------------------------------------------------------------------------


def test_slurmrestd_v0040_talapas():
    doc = json.loads((DATA / "slurmrestd" / "lcrownover_v0.0.40_slurm23.11.1_jobs.json").read_text())
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, now=NOW)
    assert (rejected, problems) == (0, [])
    task, pending = jobs
    assert set(task) == set(JOB_COLUMNS)
    assert pick(task, "cluster", "job_key", "job_id", "array_job_id", "array_task_id", "het_job_id", "name", "user_name",
                "account", "partition", "qos", "state", "state_raw", "exit_code", "nodes", "node_count") == (
        "talapas", "7745162", "7725337_411", "7725337", "411", None, "rands", "rdennis", "jamming", "preempt", "normal",
        "RUNNING", "RUNNING", "0:0", "n0180", 1)
    # epochs 1722268317 / 1722268326 / 1722274361; end_time of a RUNNING job is only a forecast
    assert pick(task, "submit", "eligible", "start", "end") == (
        datetime(2024, 7, 29, 15, 51, 57), datetime(2024, 7, 29, 15, 52, 6), datetime(2024, 7, 29, 17, 32, 41), None)
    assert pick(task, "gpus", "alloc_tres", "source", "updated_at") == (0, "cpu=1,mem=4G,node=1,billing=1", "slurmrestd", NOW)
    assert pick(pending, "job_key", "job_id", "array_job_id", "array_task_id", "state", "start", "end", "nodes",
                "alloc_tres", "gpus") == (
        "7725337", "7725337_[412-9999]", "7725337", "412-9999", "PENDING", None, None, None, None, 0)


def test_slurmrestd_older_shapes_het_and_bad_records():
    doc = {"jobs": [
        {  # dbv0.0.37 (sacct --json, Slurm 21.08): state.current string, time.*, tres.allocated list
            "job_id": 42, "name": "train", "user": "bob", "account": "bio", "partition": "gpu", "qos": "normal",
            "cluster": "old", "state": {"current": "COMPLETED", "reason": "None"},
            "time": {"submission": 1700000000, "eligible": 1700000000, "start": 1700000060, "end": 1700003660},
            "array": {"job_id": 0, "task_id": 4294967294, "task": ""}, "het": {"job_id": 0, "job_offset": 4294967294},
            "tres": {"allocated": [{"type": "cpu", "name": "", "count": 8},
                                   {"type": "gres", "name": "gpu", "count": 2},
                                   {"type": "gres", "name": "gpu:a100", "count": 2}]},
            "exit_code": {"status": "SUCCESS", "return_code": 0}, "nodes": "g[1-2]", "allocation_nodes": 2,
        },
        {  # v0.0.41+ slurmdb: state.current list, return_code object, array task object
            "job_id": 43, "name": "a", "user": "bob", "account": "bio", "state": {"current": ["FAILED"]},
            "time": {"submission": 1700000000, "start": 1700000001, "end": 1700000002},
            "array": {"job_id": 40, "task_id": {"set": True, "infinite": False, "number": 3}},
            "exit_code": {"return_code": {"set": True, "number": 1}, "signal": {"id": {"set": False, "number": 0}}},
            "tres": {"allocated": [], "requested": [{"type": "gres", "name": "gpu", "count": 1}]},
        },
        {  # v0.0.40 slurmctld het component, gpus only in gres_detail
            "job_id": 1855, "job_state": ["RUNNING"], "het_job_id": {"set": True, "number": 1853},
            "het_job_offset": {"set": True, "number": 2}, "tres_alloc_str": "cpu=1,node=1",
            "gres_detail": ["gpu:h100:4(IDX:0-3)"], "start_time": {"set": True, "number": 1700000000},
        },
        {"job_id": 44, "job_state": ["WIBBLE"]},
        "not a job",
        {"name": "no id"},
    ]}
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, cluster=None, now=NOW)
    old, new, het, odd = jobs
    assert pick(old, "cluster", "job_id", "array_job_id", "het_job_id", "state", "exit_code", "gpus", "gpu_type",
                "node_count", "nodes", "user_name", "start", "end") == (
        "old", "42", None, None, "COMPLETED", "0:0", 2, "a100", 2, "g[1-2]", "bob",
        datetime(2023, 11, 14, 22, 14, 20), datetime(2023, 11, 14, 23, 14, 20))
    assert pick(new, "job_key", "job_id", "array_task_id", "state", "exit_code", "gpus") == ("43", "40_3", "3", "FAILED", "1:0", 1)
    assert pick(het, "job_key", "job_id", "het_job_id", "het_job_offset", "gpus", "gpu_type", "cluster") == (
        "1855", "1853+2", "1853", 2, 4, "h100", "default")
    assert pick(odd, "state", "state_raw") == ("UNKNOWN", "WIBBLE")
    assert rejected == 2
    assert [p.split(":")[0] for p in problems] == ["jobs[3]", "jobs[4]", "jobs[5]"]
    assert parse_slurmrestd_jobs({"errors": ["boom"]}) == ([], 1, ["no 'jobs' list in the document (keys: ['errors'])"])


# ---- sacct: bad and odd input ------------------------------------------------------------------

HEADER = "JobID|JobIDRaw|JobName|Account|State|ExitCode|Start|End|AllocTRES"


def test_steps_skipped_everywhere_and_jobidraw_is_the_key():
    text = "\n".join([
        HEADER,
        "123|123|a|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|gres/gpu=1",
        "123.batch|123.batch|batch|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|",
        "123.extern|123.extern|extern|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|",
        "123.0|123.0|python|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|",
        "200_7|207|arr|x|RUNNING|0:0|2026-01-01T00:00:00|Unknown|gres/gpu=2",
        "200_7.batch|207.batch|batch|x|RUNNING|0:0|2026-01-01T00:00:00|Unknown|",
        "300+0|300|het|x|PENDING|0:0|None|Unknown|",
        "300+0.batch|300.batch|batch|x|PENDING|0:0|None|Unknown|",
    ])
    jobs, rejected, problems = parse_sacct(text, now=NOW)
    assert (rejected, problems) == (0, [])
    assert [pick(j, "job_key", "job_id", "array_job_id", "array_task_id", "het_job_id", "het_job_offset", "gpus", "end")
            for j in jobs] == [
        ("123", "123", None, None, None, None, 1, datetime(2026, 1, 1, 1)),
        ("207", "200_7", "200", "7", None, None, 2, None),
        ("300", "300+0", None, None, "300", 0, None, None),
    ]


def test_wrong_field_count_rejected_with_line_number():
    text = "\n".join([
        "JobID|State|ExitCode",
        "1|COMPLETED|0:0",
        "2|COMPLETED",
        "3|COMPLETED|0:0|extra",
        "4|FAILED|1:0",
    ])
    jobs, rejected, problems = parse_sacct(text, now=NOW)
    assert [j["job_id"] for j in jobs] == ["1", "4"]
    assert rejected == 2
    assert problems[0].startswith("line 3: 2 fields, expected 3")
    assert problems[1].startswith("line 4: 4 fields, expected 3")


def test_unknown_state_kept_and_reported():
    jobs, rejected, problems = parse_sacct("JobID|State\n7|WIBBLING\n8|OUT_OF_MEMORY\n9|NODE_FAIL\n", now=NOW)
    assert rejected == 0
    assert [pick(j, "state", "state_raw") for j in jobs] == [
        ("UNKNOWN", "WIBBLING"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("NODE_FAIL", "NODE_FAIL")]
    assert problems == ["line 2: unknown state 'WIBBLING' for job 7, kept as UNKNOWN"]


@pytest.mark.parametrize("state", [
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "PENDING", "RUNNING",
    "REQUEUED", "SUSPENDED", "BOOT_FAIL", "DEADLINE", "RESIZING", "REVOKED", "SPECIAL_EXIT",
])
def test_every_documented_state(state):
    jobs, _, problems = parse_sacct(f"JobID|State\n1|{state}\n", now=NOW)
    assert (jobs[0]["state"], problems) == (state, [])


def test_job_name_containing_the_delimiter():
    text = "\n".join([
        HEADER,
        "10|10|a|b|c|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|gres/gpu=1",
        "11|11||||x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|",  # name "||"
        "12|12|<b>\"q'|x|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T01:00:00|",
        "13|13|a|b|x|COMPLETED|0:0|2026-01-01T00:00:00|garbage|",  # too many fields AND bad End
    ])
    jobs, rejected, problems = parse_sacct(text, now=NOW)
    assert [(j["job_id"], j["name"], j["account"], j["gpus"]) for j in jobs] == [
        ("10", "a|b|c", "x", 1), ("11", "||", "x", None), ("12", "<b>\"q'", "x", None)]
    assert rejected == 1
    assert problems[0].startswith("line 5: 10 fields, expected 9; JobName with the delimiter did not fit")
    # without a JobName column an extra field cannot be explained: rejected
    jobs, rejected, _ = parse_sacct("JobID|State\n1|COMPLETED|x\n", now=NOW)
    assert (jobs, rejected) == ([], 1)


def test_job_name_holding_a_line_break_is_continued_by_the_next_line():
    # sbatch --job-name takes "\r\n" and sacct prints it as is (seen on a real Slurm 22.05)
    us = "\x1f"
    fields = ["JobIDRaw", "State", "JobName"]
    text = f"1{us}COMPLETED{us}idle <x>\r\nBcc: a@b\n2{us}FAILED{us}a|b\n\nc\n3{us}RUNNING{us}plain\r\n"
    jobs, rejected, problems = parse_sacct(text, fields=fields, delimiter=us, now=NOW)
    assert ([pick(j, "job_id", "state", "name") for j in jobs], rejected, problems) == (
        [("1", "COMPLETED", "idle <x>\r\nBcc: a@b"), ("2", "FAILED", "a|b\nc"), ("3", "RUNNING", "plain")], 0, [])
    # --parsable (a trailing delimiter): the record ends where the delimiter comes
    jobs, rejected, _ = parse_sacct("JobID|State|JobName|\n1|COMPLETED|two\nlines|\n2|FAILED|x|\n", now=NOW)
    assert ([pick(j, "job_id", "name") for j in jobs], rejected) == ([("1", "two\nlines"), ("2", "x")], 0)
    # a short line that starts with a job ID is a cut-off record, not a name's second line: rejected, loud
    jobs, rejected, problems = parse_sacct("JobID|State|JobName\n1|COMPLETED|ok\n5|COMPL\n", now=NOW)
    assert ([pick(j, "job_id", "name") for j in jobs], rejected) == ([("1", "ok")], 1)
    assert problems == ["line 3: 2 fields, expected 3: '5|COMPL'"]
    # without JobName last, a short line continues nothing
    jobs, rejected, _ = parse_sacct("JobID|JobName|State\n1|a\nb|COMPLETED\n", now=NOW)
    assert (jobs, rejected) == ([], 2)


def test_parsable_trailing_delimiter_and_custom_delimiter():
    jobs, rejected, _ = parse_sacct("JobID|State|JobName|\n1|COMPLETED|a|b|\n2|FAILED||\n", now=NOW)
    assert rejected == 0
    assert [pick(j, "job_id", "state", "name") for j in jobs] == [("1", "COMPLETED", "a|b"), ("2", "FAILED", None)]
    us = "\x1f"
    text = f"5{us}5{us}RUNNING{us}name | with ☃ pipes\n6{us}6{us}PENDING{us}\n"
    jobs, rejected, _ = parse_sacct(text, fields=["JobID", "JobIDRaw", "State", "JobName"], delimiter=us, now=NOW)
    assert rejected == 0
    assert [pick(j, "job_id", "state", "name") for j in jobs] == [("5", "RUNNING", "name | with ☃ pipes"), ("6", "PENDING", None)]
    snow = "☃"  # hb-jobinfo's delimiter
    jobs, _, _ = parse_sacct(f"JobID{snow}State\n8{snow}TIMEOUT\n", delimiter=snow, now=NOW)
    assert jobs[0]["state"] == "TIMEOUT"


def test_garbage_bytes_never_lose_the_good_lines():
    good = b"1|COMPLETED|0:0\n"
    text = b"JobID|State|ExitCode\n" + good + b"\xff\xfe\x00\x01garbage\n" + b"\x1b[31m|\x80|\n" + b"2|FAILED|1:0\r\n"
    jobs, rejected, problems = parse_sacct(text, now=NOW)
    assert [j["job_id"] for j in jobs] == ["1", "2"]
    assert rejected == 2
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 4"]
    assert "bad JobID" in problems[1]


def test_repeated_header_skipped_and_no_jobid_column():
    jobs, rejected, _ = parse_sacct("JobID|State\n1|RUNNING\nJobID|State\n2|RUNNING\n", now=NOW)
    assert ([j["job_id"] for j in jobs], rejected) == (["1", "2"], 0)
    jobs, rejected, _ = parse_sacct("JobID|State\n1|RUNNING\n", fields=["JobID", "State"], now=NOW)
    assert ([j["job_id"] for j in jobs], rejected) == (["1"], 0)
    jobs, rejected, problems = parse_sacct("User|State\nbob|RUNNING\n", now=NOW)
    assert (jobs, rejected) == ([], 1) and "no JobID column" in problems[0]
    assert parse_sacct("", now=NOW) == ([], 0, [])


def test_problems_are_capped():
    text = "JobID|State\n" + "x|y|z\n" * (MAX_PROBLEMS + 30)
    _, rejected, problems = parse_sacct(text, now=NOW)
    assert rejected == MAX_PROBLEMS + 30
    assert len(problems) == MAX_PROBLEMS + 1 and problems[-1] == "... and 30 more"


def test_bad_values_reject_the_line():
    text = "JobID|State|ExitCode|Start|Elapsed|NNodes\n" + "\n".join([
        "1|COMPLETED|0:0|2026-01-01T00:00:00|01:00:00|1",
        "2|COMPLETED|0:0|yesterday|01:00:00|1",
        "3|COMPLETED|zero|2026-01-01T00:00:00|01:00:00|1",
        "4|COMPLETED|0:0|2026-01-01T00:00:00|an hour|1",
        "5|COMPLETED|0:0|2026-01-01T00:00:00|01:00:00|two",
        "6_[x]|PENDING|0:0|None|00:00:00|1",
    ])
    jobs, rejected, problems = parse_sacct(text, now=NOW)
    assert [j["job_id"] for j in jobs] == ["1"]
    assert rejected == 5
    assert ["yesterday" in problems[0], "ExitCode" in problems[1], "elapsed" in problems[2],
            "NNodes" in problems[3], "JobID" in problems[4]] == [True] * 5


def test_gpu_fallbacks_req_tres_and_gres_columns():
    text = "JobID|State|AllocTRES|ReqTRES|AllocGRES|ReqGRES\n" + "\n".join([
        "1|PENDING||cpu=1,gres/gpu:a100=2||",  # pending: nothing allocated yet, requested 2
        "2|COMPLETED|cpu=1|||gpu:tesla:4",  # AllocTRES without gres (untracked): old ReqGRES
        "3|COMPLETED|cpu=1||gpu:k80:2(IDX:0-1)|gpu:3",  # allocated beats requested
        "4|COMPLETED|cpu=1|cpu=1||",  # TRES reported, no GPU: a CPU job
        "5|PENDING||||",  # nothing known
    ])
    jobs, rejected, _ = parse_sacct(text, now=NOW)
    assert rejected == 0
    assert [(j["gpus"], j["gpu_type"]) for j in jobs] == [(2, "a100"), (4, "tesla"), (2, "k80"), (0, None), (None, None)]


def test_times_in_the_clusters_zone_become_utc():
    tz = "America/New_York"
    assert parse_time("2026-07-01T12:00:00", tz) == datetime(2026, 7, 1, 16, 0)  # EDT
    assert parse_time("2026-01-15T12:00:00", tz) == datetime(2026, 1, 15, 17, 0)  # EST
    assert parse_time("2026-07-01T12:00:00") == datetime(2026, 7, 1, 12, 0)
    assert parse_time("2026-07-01T12:00:00+02:00", tz) == datetime(2026, 7, 1, 10, 0)
    assert parse_time("1722268317") == datetime(2024, 7, 29, 15, 51, 57)
    for none in ("Unknown", "None", "", "  ", None, "N/A", "0"):
        assert parse_time(none, tz) is None
    with pytest.raises(ValueError):
        parse_time("2026-13-01T00:00:00")
    jobs, _, _ = parse_sacct("JobID|Submit|Start|End\n1|2026-07-01T12:00:00|2026-07-01T12:00:05|Unknown\n", tz=tz, now=NOW)
    assert pick(jobs[0], "submit", "start", "end") == (datetime(2026, 7, 1, 16, 0), datetime(2026, 7, 1, 16, 0, 5), None)


def test_elapsed_formats():
    assert parse_elapsed("3-00:00:00") == 3 * 86400
    assert parse_elapsed("2-22:03:04") == 2 * 86400 + 22 * 3600 + 3 * 60 + 4
    assert parse_elapsed("14:00:49") == 14 * 3600 + 49
    assert parse_elapsed("00:00:00") == 0
    assert parse_elapsed("05:51.123") == pytest.approx(5 * 60 + 51.123)
    assert parse_elapsed("1-02:03") == 86400 + 2 * 3600 + 3 * 60
    for none in ("", "INVALID", "UNLIMITED", "Partition_Limit", None):
        assert parse_elapsed(none) is None
    assert parse_elapsed("1-02") == 86400 + 2 * 3600
    for bad in ("12", "a:b", "1:2:3:4", "1.5:00", "-1"):
        with pytest.raises(ValueError):
            parse_elapsed(bad)


def test_nodelist_none_assigned_and_cluster_column():
    text = "JobID|Cluster|State|NNodes|NodeList\n1|alpha|PENDING|1|None assigned\n2||RUNNING|2|n[1-2]\n"
    jobs, _, _ = parse_sacct(text, cluster=None, now=NOW)
    assert [pick(j, "cluster", "nodes", "node_count") for j in jobs] == [("alpha", None, 1), ("default", "n[1-2]", 2)]


def test_slurmctld_exit_code_is_a_wait_status_and_a_failure_never_reads_as_success():
    """slurmctld's v0.0.37/38 exit_code is the raw wait status, as seen from the real 22.05
    slurmrestd (768 for `exit 3`, 15 for a job killed by SIGTERM); 22.05's dbv0.0.38 answers
    {SUCCESS, 0} even for a FAILED job, which is then unknown, not 0:0."""
    ctld = [{"job_id": n, "job_state": s, "exit_code": ec, "user_name": "u"}
            for n, s, ec in ((1, "FAILED", 768), (2, "CANCELLED", 15), (3, "RUNNING", 0), (4, "FAILED", 256 * 255 + 9))]
    db = [{"job_id": 5, "state": {"current": "FAILED", "reason": "None"}, "exit_code": {"status": "SUCCESS", "return_code": 0}},
          {"job_id": 6, "state": {"current": "FAILED"}, "exit_code": {"status": "FAILED", "return_code": 2}},
          {"job_id": 7, "state": {"current": "COMPLETED"}, "exit_code": {"status": "SUCCESS", "return_code": 0}}]
    rows, rejected, _ = parse_slurmrestd_jobs({"jobs": ctld + db})
    assert rejected == 0
    assert [r["exit_code"] for r in rows] == ["3:0", "0:15", "0:0", "255:9", None, "2:0", "0:0"]


def test_tres_without_a_count_is_left_out_of_alloc_tres():
    """22.05's dbv0.0.38 lists energy with count null in tres.allocated (seen on the real
    slurmrestd); sacct's AllocTRES leaves it out, so must we, not write 'energy=None'."""
    tres = [{"type": "cpu", "name": None, "id": 1, "count": 1}, {"type": "energy", "name": None, "id": 3, "count": None},
            {"type": "node", "name": None, "id": 4, "count": 1}, {"type": "gres", "name": "gpu", "id": 1001, "count": 2}]
    rows, rejected, _ = parse_slurmrestd_jobs({"jobs": [{"job_id": 9, "state": {"current": "COMPLETED"}, "tres": {"allocated": tres}}]})
    assert rejected == 0 and (rows[0]["alloc_tres"], rows[0]["gpus"]) == ("cpu=1,node=1,gres/gpu=2", 2)
