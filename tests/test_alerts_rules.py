"""The alert and recording rules in alerts/: generated from one thresholds file, valid for promtool,
unit-tested by promtool (every alert fires and stays quiet where it must), and run over the real
dcgm-exporter dumps in shared/data/dcgm-exporter/."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.support.shared_data import SHARED_DATA, require_shared_data

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "alerts"
RULES = sorted((ALERTS / "rules").glob("*.rules.yml"))
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.test.yml"))
DCGM_DATA = SHARED_DATA / "dcgm-exporter"

_spec = importlib.util.spec_from_file_location("gpufleet_alerts_build", ALERTS / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

SEVERITIES = {"critical", "warning", "info"}
# Alerts about a scrape target, a source or the whole fleet, not one GPU: they name the host through
# the target (instance) instead of a GPU's labels.
NOT_PER_GPU = {
    "GpuExporterDown", "GpuExporterTargetsAbsent", "GpufleetCollectorDown", "GpufleetCollectorTargetDown",
    "GpufleetUtilizationLow", "GpuExporterSourceFailing", "GpufleetCollectorSourceFailing",
    "GpufleetCollectorDataStale", "GpuAllocationsWithoutUtilization", "GpufleetPolicyEnforcementFailing",
    "GpufleetFactsBacklogStuck", "GpufleetLemonNode", "GpufleetHardwareInterruptionRateHigh",
}
# Level conditions held for a `for:`: each needs a unit test where the condition comes and goes
# faster than `for:` ("flapping") and no alert fires. Exempt: event windows (XID, ECC, remapped rows:
# the window itself is the debounce), absent(), and GpuAllocationsWithoutUtilization (a join
# that either works or does not).
NEEDS_FLAPPING_CASE = {
    "GpuExporterDown", "GpufleetCollectorDown", "GpufleetCollectorTargetDown", "GpuDisappeared", "GpuLost",
    "GpuTemperatureHigh", "GpuMemoryTemperatureHigh", "GpuThermalThrottling", "GpuHardwareSlowdown",
    "GpuAllocatedIdle", "GpuAllocatedNoProcess", "GpufleetUtilizationLow", "GpuExporterSourceFailing",
    "GpufleetCollectorSourceFailing", "GpufleetFactsBacklogStuck", "GpuForeignProcesses",
}
# Alerts on a numeric threshold: each needs a unit test with a value just below it.
NEEDS_JUST_BELOW_CASE = {
    "GpuTemperatureHigh", "GpuMemoryTemperatureHigh", "GpuThermalThrottling", "GpuPowerThrottling",
    "GpuAllocatedIdle", "GpufleetUtilizationLow", "GpufleetCollectorDataStale",
}


def alert_rules() -> list[tuple[str, dict]]:
    out = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(group["name"], r) for r in group["rules"] if "alert" in r]
    return out


def unit_cases() -> list[tuple[str, dict]]:
    """(test name, alert_rule_test entry) for every alert test case in alerts/tests/."""
    out = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            out += [(test.get("name", ""), case) for case in test.get("alert_rule_test", [])]
    return out


# ---------------------------------------------------------------- one place for thresholds


def test_committed_rules_are_what_the_generator_makes_from_thresholds_yml():
    r = subprocess.run([sys.executable, str(ALERTS / "build.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in RULES} == set(build.render())


def test_generator_overrides_reach_the_rules_and_unknown_names_are_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ALERTS / "build.py"), "--out", str(tmp_path), "--set", "idle_for=10s", "--set", "idle_threshold_percent=2"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    idle = next(
        rule for group in yaml.safe_load((tmp_path / "gpufleet-alerts.rules.yml").read_text())["groups"]
        for rule in group["rules"] if rule.get("alert") == "GpuAllocatedIdle"
    )
    assert idle["for"] == "10s" and idle["expr"].rstrip().endswith("< 0.02")
    for bad, message in (
        (["--set", "idle_forr=10s"], "no such threshold"),
        (["--set", "idle_for=ten minutes"], "Prometheus duration"),
        (["--set", "gpu_temp_warning_celsius=-3"], "number >= 0"),
        (["--set", "xid_application=[13, 48]"], "XID 48 is in both"),
    ):
        r = subprocess.run([sys.executable, str(ALERTS / "build.py"), "--out", str(tmp_path), *bad], capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (bad, r.stderr)


def test_templates_hold_no_literal_thresholds_or_windows():
    """Every duration and range window in the rule templates comes from thresholds.yml."""
    for src in (ALERTS / "src").glob("*.yml"):
        text = "\n".join(ln for ln in src.read_text().splitlines() if not ln.lstrip().startswith("#"))
        assert not re.findall(r"\[\d+[smhdwy]\]", text), f"{src.name}: a literal range window"
        assert not re.findall(r"(?m)^\s*for:\s*\d", text), f"{src.name}: a literal for:"
        assert not re.findall(r"offset \d", text), f"{src.name}: a literal offset"
        # comparisons against a number other than 0 (thresholds come in as ${...})
        assert not re.findall(r"(?<![=!])[<>]=?\s*(?!0(?![\d.]))\d", text), f"{src.name}: a literal threshold"


def test_idle_threshold_is_the_one_the_waste_report_uses():
    from gpufleet.analytics.params import Params

    thresholds = yaml.safe_load((ALERTS / "thresholds.yml").read_text())
    default = Params.__dataclass_fields__["idle_threshold"].default
    assert thresholds["idle_threshold_percent"] == default


# ---------------------------------------------------------------- promtool


@pytest.mark.realstack
@pytest.mark.parametrize("path", RULES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool, path):
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@pytest.mark.realstack
@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(promtool, path):
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300, cwd=path.parent)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- what every alert carries


def test_every_alert_has_for_severity_summary_description_and_a_runbook():
    readme = (ALERTS / "README.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"(?m)^### (\S+)\s*$", readme)}
    rules = alert_rules()
    assert len({r["alert"] for _, r in rules}) >= 24
    for group, rule in rules:
        name = rule["alert"]
        assert "for" in rule, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        ann = rule["annotations"]
        assert ann.get("summary") and ann.get("description"), name
        assert ann["runbook_url"].endswith("#" + name.lower()), name
        assert name.lower() in anchors, f"alerts/README.md has no runbook section '### {name}'"
        text = ann["summary"] + " " + ann["description"]
        if name == "GpuExporterTargetsAbsent":  # no target left to name
            assert "${" not in text and "job=~" in text, name
        elif name in NOT_PER_GPU:
            assert "$labels.instance" in text or "$labels.Hostname" in text or "$labels.cluster" in text, f"{name}: names no host"
        else:
            for label in ("$labels.Hostname", "$labels.gpu", "$labels.UUID"):
                assert label in text, f"{name}: annotations do not name {label}"
            assert "$labels.job_id" in text or "gpufleet_gpu_job_info" in text, f"{name}: annotations do not name the job"


def test_gpu_alerts_keep_the_gpu_identity_and_waste_alerts_the_holder():
    """What Alertmanager groups and inhibits by must survive the rules' aggregations."""
    for _, rule in alert_rules():
        if rule["alert"] in NOT_PER_GPU:
            continue
        expr = rule["expr"]
        for agg in re.findall(r"\b(?:max|min|sum|avg|count|group) by \(([^)]*)\)", expr):
            labels = {x.strip() for x in agg.split(",")}
            if "xid" not in labels and "reason" not in labels and labels != {"cluster", "Hostname"}:
                assert {"Hostname", "gpu", "UUID"} <= labels or "scheduler" in labels, (rule["alert"], agg)
    waste = [r for _, r in alert_rules() if r["labels"].get("category") == "waste"]
    assert {r["alert"] for r in waste} == {"GpuAllocatedIdle", "GpuAllocatedNoProcess"}


def test_every_alert_has_unit_cases_that_fire_and_that_stay_quiet():
    cases = unit_cases()
    names = {r["alert"] for _, r in alert_rules()}
    fires = {c["alertname"] for _, c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for _, c in cases if not c.get("exp_alerts")}
    assert names - fires == set(), f"alerts never shown firing: {sorted(names - fires)}"
    assert names - quiet == set(), f"alerts never shown staying quiet: {sorted(names - quiet)}"
    flapping = {c["alertname"] for test, c in cases if "flapping" in test.lower() and not c.get("exp_alerts")}
    assert NEEDS_FLAPPING_CASE - flapping == set(), f"no flapping case: {sorted(NEEDS_FLAPPING_CASE - flapping)}"
    just_below = {c["alertname"] for test, c in cases if "just below" in test.lower()}
    assert NEEDS_JUST_BELOW_CASE - just_below == set(), f"no just-below case: {sorted(NEEDS_JUST_BELOW_CASE - just_below)}"
    assert (NEEDS_FLAPPING_CASE | NEEDS_JUST_BELOW_CASE) <= names


def test_firing_cases_check_every_label_and_annotation():
    for test, case in unit_cases():
        for exp in case.get("exp_alerts") or []:
            assert exp.get("exp_labels", {}).get("severity") in SEVERITIES, test
            assert set(exp.get("exp_annotations", {})) == {"summary", "description", "runbook_url"}, test


# ---------------------------------------------------------------- the real dcgm-exporter dumps

SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)\s*$")
LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def read_dump(path: Path) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each DCGM_FI_* sample; empty labels dropped as Prometheus does."""
    out = []
    for line in path.read_text().splitlines():
        m = SAMPLE_RE.match(line)
        if not m or not m.group(1).startswith("DCGM_FI_"):
            continue
        labels = {k: v for k, v in LABEL_RE.findall(m.group(2) or "") if v != ""}
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


@pytest.mark.realstack
def test_rules_over_the_real_dcgm_exporter_dumps(promtool, tmp_path):
    """Every saved dcgm-exporter 2.x-4.x dump, an hour long, with Slurm/Kubernetes job info for some of
    its GPUs: utilization is recorded once per GPU or MIG instance, exactly the allocated GPUs below 5%
    raise GpuAllocatedIdle (labels checked), and nothing else fires on these healthy nodes (the README
    sample's blank MEMORY_TEMP sentinel, the T4's MEMORY_TEMP 0, the L4's remap counters included)."""
    require_shared_data()  # (a glob of an absent folder is empty: say why, do not fail on the count)
    dumps = sorted(p for p in DCGM_DATA.glob("*.prom") if read_dump(p))
    assert len(dumps) >= 5
    inputs: list[dict] = []
    util: dict[tuple, float] = {}  # (Hostname, gpu, UUID, GPU_I_ID) -> ratio, as the recording rule should see it
    gr_engine: dict[tuple, float] = {}
    mem_temps: set[tuple] = set()
    for i, path in enumerate(dumps):
        inst = f"10.99.0.{i + 1}:9400"
        inputs.append({"series": series("up", {"job": "dcgm-exporter", "instance": inst}), "values": "1x70"})
        for name, labels, value in read_dump(path):
            inputs.append({"series": series(name, {**labels, "instance": inst, "job": "dcgm-exporter"}), "values": f"{value:.17g}x70"})
            key = (labels.get("Hostname", ""), labels["gpu"], labels["UUID"], labels.get("GPU_I_ID", ""))
            if value >= 2147483632:
                continue
            if name == "DCGM_FI_DEV_GPU_UTIL":
                util[key] = max(util.get(key, 0.0), value / 100)
            elif name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                gr_engine[key] = max(gr_engine.get(key, 0.0), value)
            elif name == "DCGM_FI_DEV_MEMORY_TEMP":
                mem_temps.add(key[:3])
    for key, v in gr_engine.items():
        util.setdefault(key, v)
    # the dumps' MIG instances and whole GPUs, as the rule must count them
    by_host: dict[str, int] = {}
    for host, *_ in util:
        by_host[host] = by_host.get(host, 0) + 1

    # job info from a gpufleet exporter beside each dcgm-exporter: every second GPU (or MIG instance) held
    held = sorted(util)[::2]
    expected_idle = []
    for n, (host, gpu, uuid, gi) in enumerate(held):
        labels = {"gpu": gpu, "UUID": uuid}
        if gi:
            labels["GPU_I_ID"] = gi
        if host:
            labels["Hostname"] = host
        holder = {"scheduler": "slurm", "job_id": str(9000 + n)} if n % 2 else {"scheduler": "kubernetes", "namespace": "team-a", "pod": f"p-{n}", "container": "main"}
        inputs.append({"series": series("gpufleet_gpu_job_info", {**labels, **holder, "instance": "x:9402", "job": "gpufleet-exporter"}), "values": "1x70"})
        if util[(host, gpu, uuid, gi)] < 0.05:
            account = "team-a" if holder["scheduler"] == "kubernetes" else "unknown"
            expected_idle.append({"labels": series("ALERTS", {
                "alertname": "GpuAllocatedIdle", "alertstate": "firing", "severity": "warning", "category": "waste",
                **labels, **holder, "account": account,
            })})
    assert expected_idle and any("GPU_I_ID" in e["labels"] for e in expected_idle)

    for e in expected_idle:
        e["value"] = 1
    test = {
        "rule_files": [str(p) for p in RULES],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "real dumps",
            "interval": "1m",
            "input_series": inputs,
            "promql_expr_test": [
                {"expr": "count by (Hostname) (gpufleet:gpu_utilization:ratio)", "eval_time": "70m",
                 "exp_samples": [{"labels": series("", {"Hostname": h} if h else {}), "value": n} for h, n in sorted(by_host.items())]},
                {"expr": "count(gpufleet:gpu_memory_temperature_celsius:max)", "eval_time": "70m",
                 "exp_samples": [{"labels": "{}", "value": len(mem_temps)}]},
                {"expr": 'ALERTS{alertname="GpuAllocatedIdle"}', "eval_time": "70m", "exp_samples": expected_idle},
                {"expr": 'ALERTS{alertname!="GpuAllocatedIdle",alertstate="firing"}', "eval_time": "70m", "exp_samples": []},
                # these idle sample nodes are a fleet below 30 %: pending, 6h before it would fire
                {"expr": 'ALERTS{alertname!="GpuAllocatedIdle",alertstate="pending"}', "eval_time": "70m", "exp_samples": [
                    {"labels": series("ALERTS", {"alertname": "GpufleetUtilizationLow", "alertstate": "pending", "severity": "info", "category": "capacity"}), "value": 1},
                ]},
            ],
        }],
    }
    path = tmp_path / "real-dumps.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
