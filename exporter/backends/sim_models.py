"""Physical envelopes of the GPU models the simulator can play.

These are nominal board figures (memory, TDP, clocks) used only to make simulated telemetry
plausible; they are not used by any analytics. `supports` lists which optional NVML readings
the real board gives, so the simulator leaves out what the real GPU would not report; `gpm` says
whether the board has NVML's GPU Performance Monitoring (Hopper and later), the source of the
profiling fields (DCGM_FI_PROF_*) on a node without DCGM.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimModel:
    name: str
    memory_mib: int
    tdp_w: float
    idle_w: float
    max_sm_mhz: int
    idle_sm_mhz: int
    mem_mhz: int
    mig_profiles: dict[str, int] = field(default_factory=dict)  # profile -> memory MiB
    supports_memory_temp: bool = True
    supports_row_remap: bool = True
    gpm: bool = False


MODELS: dict[str, SimModel] = {
    m.name: m
    for m in (
        SimModel(
            "NVIDIA H100 80GB HBM3", 81559, 700, 70, 1980, 345, 2619,
            {"1g.10gb": 9856, "1g.20gb": 19968, "2g.20gb": 19968, "3g.40gb": 40192, "4g.40gb": 40192, "7g.80gb": 80384},
            gpm=True,
        ),
        # H200 and B200: no MIG profiles modelled
        SimModel("NVIDIA H200", 143771, 700, 75, 1980, 345, 3201, gpm=True),
        SimModel("NVIDIA B200", 183359, 1000, 140, 1965, 345, 3996, gpm=True),
        SimModel(
            "NVIDIA A100-SXM4-80GB", 81920, 400, 55, 1410, 210, 1593,
            {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192, "4g.40gb": 40192, "7g.80gb": 80896},
        ),
        SimModel(
            "NVIDIA A100-SXM4-40GB", 40960, 400, 50, 1410, 210, 1215,
            {"1g.5gb": 4864, "2g.10gb": 9856, "3g.20gb": 19968, "4g.20gb": 19968, "7g.40gb": 40192},
        ),
        SimModel("NVIDIA L4", 23034, 72, 16, 2040, 210, 6251, supports_memory_temp=False, supports_row_remap=False),
        SimModel("Tesla T4", 15360, 70, 10, 1590, 300, 5000, supports_memory_temp=False, supports_row_remap=False),
    )
}

ALIASES = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "b200": "NVIDIA B200", "a100": "NVIDIA A100-SXM4-80GB", "a100-40gb": "NVIDIA A100-SXM4-40GB", "l4": "NVIDIA L4", "t4": "Tesla T4"}


def lookup(name: str) -> SimModel | None:
    """Find a model by its NVML name or a short alias (case-insensitive)."""
    if name in MODELS:
        return MODELS[name]
    full = ALIASES.get(name.lower())
    if full:
        return MODELS[full]
    for m in MODELS.values():
        if m.name.lower() == name.lower():
            return m
    return None


def known_names() -> str:
    return ", ".join(sorted(ALIASES)) + " or " + ", ".join(repr(n) for n in MODELS)
