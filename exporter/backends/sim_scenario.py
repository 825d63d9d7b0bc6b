"""Simulation scenarios: what each simulated GPU does over time, read from a TOML file.

A scenario is data, so tests, the demo and the end-to-end test describe fleets without code.
Example (every key optional):

    hostname = "sim-node-01"
    model = "h100"            # NVML name or alias, see sim_models
    profiling = "gpm"         # DCGM_FI_PROF_*: "gpm" (NVML GPM; default where the model has it:
                              # H100, H200, B200), "dcgm" (as dcgm-exporter would publish them,
                              # any model), "none" (default without GPM: A100, L4, T4)
    gpus = 8
    driver_version = "550.54.15"
    minor_numbers = [3, 2, 1, 0, 7, 6, 5, 4]   # /dev/nvidiaN minors; default = index
    control_dir = "/run/gpufleet/sim-control" # optional live overrides, see SimBackend

    [[gpu]]
    index = 0
    utilization = { kind = "sine", mean = 50, amplitude = 40, period_s = 86400 }
    tensor_active = { kind = "constant", value = 0.4 }    # ratio (default: from utilization)
    memory_used_mib = { kind = "constant", value = 1000 } # on top of process memory
    processes = [ { pid = 4242, start_s = 0, end_s = 600, used_memory_mib = 30000, sm_util = 90 } ]
    xid = [ { at_s = 30, code = 79 } ]
    lost_at_s = 120
    mig = [ "3g.40gb", { profile = "2g.20gb", utilization = { kind = "constant", value = 80 } } ]
    fields = { DCGM_FI_DEV_GPU_TEMP = { kind = "constant", value = 92 } }  # any DCGM field

Trace kinds: constant(value), steps(points=[[t, v], ...], held until the next point),
sine(mean, amplitude, period_s, phase_s), random(mean, spread, step_s, seed). Times are seconds
since the simulation started.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.config import ConfigError, load_file

from gpufleet.exporter.backends import sim_models
from gpufleet.exporter.fields import FIELDS

TRACE_KINDS = ("constant", "steps", "sine", "random")
PROFILING = ("gpm", "dcgm", "none")


@dataclass(frozen=True)
class Trace:
    kind: str
    params: tuple[tuple[str, Any], ...]

    def at(self, t: float) -> float:
        p = dict(self.params)
        if self.kind == "constant":
            return float(p["value"])
        if self.kind == "steps":
            value = float(p["points"][0][1])
            for when, v in p["points"]:
                if t >= when:
                    value = float(v)
            return value
        if self.kind == "sine":
            return p["mean"] + p["amplitude"] * math.sin(2 * math.pi * (t + p["phase_s"]) / p["period_s"])
        # random: a fresh deterministic draw every step_s seconds
        rng = random.Random(hash((p["seed"], int(t // p["step_s"]))))
        return p["mean"] + rng.uniform(-p["spread"], p["spread"])


@dataclass(frozen=True)
class SimProcess:
    pid: int
    start_s: float = 0.0
    end_s: float | None = None
    used_memory_mib: float = 0.0
    sm_util: float | None = None
    gpu_instance_id: int | None = None

    def alive(self, t: float) -> bool:
        return t >= self.start_s and (self.end_s is None or t < self.end_s)


@dataclass(frozen=True)
class SimMig:
    profile: str
    utilization: Trace | None = None


@dataclass(frozen=True)
class SimGpuSpec:
    index: int
    utilization: Trace | None = None
    tensor_active: Trace | None = None
    memory_used_mib: Trace | None = None
    processes: tuple[SimProcess, ...] = ()
    xid: tuple[tuple[float, int], ...] = ()
    lost_at_s: float | None = None
    mig: tuple[SimMig, ...] = ()
    fields: tuple[tuple[str, Trace], ...] = ()


@dataclass(frozen=True)
class Scenario:
    hostname: str = ""
    model: sim_models.SimModel = field(default_factory=lambda: sim_models.MODELS["NVIDIA H100 80GB HBM3"])
    gpus: int = 8
    driver_version: str = "550.54.15"
    minor_numbers: tuple[int, ...] = ()
    control_dir: str = ""
    gpu_specs: tuple[SimGpuSpec, ...] = ()
    profiling: str = "gpm"  # see PROFILING; parse() defaults it by model

    def spec(self, index: int) -> SimGpuSpec:
        for s in self.gpu_specs:
            if s.index == index:
                return s
        return SimGpuSpec(index=index)

    def minor(self, index: int) -> int:
        return self.minor_numbers[index] if self.minor_numbers else index


class _Reader:
    """Validates one table of the scenario, naming the exact key path in every error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"scenario {self.source}: {path} = {value!r}: expected {expected}")

    def number(self, table: dict, key: str, path: str, default: Any = None, minimum: float | None = None) -> Any:
        if key not in table:
            return default
        v = table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (minimum is not None and v < minimum):
            raise self.fail(f"{path}.{key}", v, "a number" + (f" >= {minimum}" if minimum is not None else ""))
        return v

    def trace(self, value: Any, path: str) -> Trace:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return Trace("constant", (("value", float(value)),))
        if not isinstance(value, dict) or value.get("kind") not in TRACE_KINDS:
            raise self.fail(path, value, f"a number or a table with kind = one of {', '.join(TRACE_KINDS)}")
        kind = value["kind"]
        if kind == "constant":
            params = {"value": self.number(value, "value", path, default=None)}
            if params["value"] is None:
                raise self.fail(f"{path}.value", None, "a number")
        elif kind == "steps":
            pts = value.get("points")
            if not isinstance(pts, list) or not pts or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p) for p in pts
            ):
                raise self.fail(f"{path}.points", pts, "a non-empty list of [seconds, value] pairs")
            params = {"points": tuple(sorted((float(a), float(b)) for a, b in pts))}
        elif kind == "sine":
            params = {
                "mean": self.number(value, "mean", path, 50.0),
                "amplitude": self.number(value, "amplitude", path, 0.0),
                "period_s": self.number(value, "period_s", path, 86400.0, minimum=1),
                "phase_s": self.number(value, "phase_s", path, 0.0),
            }
        else:
            params = {
                "mean": self.number(value, "mean", path, 50.0),
                "spread": self.number(value, "spread", path, 10.0, minimum=0),
                "step_s": self.number(value, "step_s", path, 15.0, minimum=1),
                "seed": self.number(value, "seed", path, 0),
            }
        return Trace(kind, tuple(params.items()))

    def process(self, value: Any, path: str) -> SimProcess:
        if not isinstance(value, dict) or not isinstance(value.get("pid"), int):
            raise self.fail(path, value, "a table with an integer pid")
        return SimProcess(
            pid=value["pid"],
            start_s=self.number(value, "start_s", path, 0.0),
            end_s=self.number(value, "end_s", path, None),
            used_memory_mib=self.number(value, "used_memory_mib", path, 0.0, minimum=0),
            sm_util=self.number(value, "sm_util", path, None, minimum=0),
            gpu_instance_id=self.number(value, "gpu_instance_id", path, None, minimum=0),
        )

    def gpu(self, table: Any, path: str, model: sim_models.SimModel, count: int) -> SimGpuSpec:
        if not isinstance(table, dict):
            raise self.fail(path, table, "a table")
        allowed = {"index", "utilization", "tensor_active", "memory_used_mib", "processes", "xid", "lost_at_s", "mig", "fields"}
        extra = sorted(set(table) - allowed)
        if extra:
            raise self.fail(f"{path}.{extra[0]}", table[extra[0]], f"no such key (known: {', '.join(sorted(allowed))})")
        index = table.get("index")
        if not isinstance(index, int) or not 0 <= index < count:
            raise self.fail(f"{path}.index", index, f"an integer GPU index from 0 to {count - 1}")
        opt = lambda key: self.trace(table[key], f"{path}.{key}") if key in table else None  # noqa: E731
        procs = table.get("processes", [])
        xids = table.get("xid", [])
        migs = table.get("mig", [])
        fields = table.get("fields", {})
        if not isinstance(procs, list):
            raise self.fail(f"{path}.processes", procs, "a list of process tables")
        if not isinstance(xids, list) or not all(
            isinstance(x, dict) and isinstance(x.get("code"), int) and isinstance(x.get("at_s"), (int, float)) for x in xids
        ):
            raise self.fail(f"{path}.xid", xids, "a list of { at_s = seconds, code = integer }")
        if not isinstance(migs, list):
            raise self.fail(f"{path}.mig", migs, "a list of MIG profiles")
        if not isinstance(fields, dict) or any(k not in FIELDS for k in fields):
            bad = next((k for k in fields if k not in FIELDS), fields) if isinstance(fields, dict) else fields
            raise self.fail(f"{path}.fields", bad, "a table keyed by DCGM field names this exporter publishes")
        mig_specs = []
        for i, m in enumerate(migs):
            profile = m if isinstance(m, str) else (m.get("profile") if isinstance(m, dict) else None)
            if profile not in model.mig_profiles:
                raise self.fail(f"{path}.mig[{i}]", m, f"a MIG profile of {model.name}: {', '.join(model.mig_profiles) or 'none'}")
            util = self.trace(m["utilization"], f"{path}.mig[{i}].utilization") if isinstance(m, dict) and "utilization" in m else None
            mig_specs.append(SimMig(profile, util))
        return SimGpuSpec(
            index=index,
            utilization=opt("utilization"),
            tensor_active=opt("tensor_active"),
            memory_used_mib=opt("memory_used_mib"),
            processes=tuple(self.process(p, f"{path}.processes[{i}]") for i, p in enumerate(procs)),
            xid=tuple((float(x["at_s"]), x["code"]) for x in xids),
            lost_at_s=self.number(table, "lost_at_s", path, None, minimum=0),
            mig=tuple(mig_specs),
            fields=tuple((k, self.trace(v, f"{path}.fields.{k}")) for k, v in fields.items()),
        )


def parse(doc: dict[str, Any], source: str = "(inline)", *, model: str | None = None, gpus: int | None = None) -> Scenario:
    """Build a Scenario from a parsed TOML document; `model`/`gpus` are command-line overrides."""
    r = _Reader(source)
    allowed = {"hostname", "model", "gpus", "driver_version", "minor_numbers", "control_dir", "gpu", "profiling"}
    extra = sorted(set(doc) - allowed)
    if extra:
        raise r.fail(extra[0], doc[extra[0]], f"no such key (known: {', '.join(sorted(allowed))})")
    model_name = model or doc.get("model", "h100")
    found = sim_models.lookup(model_name) if isinstance(model_name, str) else None
    if found is None:
        raise r.fail("model", model_name, f"one of {sim_models.known_names()}")
    count = gpus if gpus is not None else doc.get("gpus", 8)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise r.fail("gpus", count, "an integer from 1 to 1024")
    minors = doc.get("minor_numbers", [])
    if not isinstance(minors, list) or (minors and (len(minors) != count or len(set(minors)) != count or not all(isinstance(m, int) and m >= 0 for m in minors))):
        raise r.fail("minor_numbers", minors, f"a list of {count} distinct non-negative integers, one per GPU")
    for key in ("hostname", "driver_version", "control_dir"):
        if key in doc and not isinstance(doc[key], str):
            raise r.fail(key, doc[key], "a string")
    profiling = doc.get("profiling", "gpm" if found.gpm else "none")
    if profiling not in PROFILING:
        raise r.fail("profiling", profiling, f"one of {', '.join(PROFILING)}")
    if profiling == "gpm" and not found.gpm:
        raise r.fail("profiling", profiling, f'"dcgm" or "none": {found.name} has no GPM (Hopper and later); '
                     '"dcgm" publishes the profiling fields as dcgm-exporter would')
    gpu_tables = doc.get("gpu", [])
    if not isinstance(gpu_tables, list):
        raise r.fail("gpu", gpu_tables, "an array of [[gpu]] tables")
    specs = tuple(r.gpu(t, f"gpu[{i}]", found, count) for i, t in enumerate(gpu_tables))
    return Scenario(
        hostname=doc.get("hostname", ""),
        model=found,
        gpus=count,
        driver_version=doc.get("driver_version", "550.54.15"),
        minor_numbers=tuple(minors),
        control_dir=doc.get("control_dir", ""),
        gpu_specs=specs,
        profiling=profiling,
    )


def load(path: str | Path | None, *, model: str | None = None, gpus: int | None = None) -> Scenario:
    """Read a scenario file (or none: an idle fleet of `gpus` x `model`)."""
    doc = load_file(path, "scenario file") if path else {}
    return parse(doc, str(path) if path else "(default)", model=model, gpus=gpus)
