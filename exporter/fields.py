"""The DCGM field catalogue: every dcgm-exporter metric this exporter can publish, named once.

Names, types, units and help texts follow dcgm-exporter's `etc/default-counters.csv` and
`dcp-metrics-included.csv` (see ../shared/data/dcgm-exporter/), so a node running this exporter
and a node running dcgm-exporter feed the same rules and dashboards.

`scope` says where a field lives on a MIG-enabled GPU: "device" fields are repeated on every
GPU-instance row (as dcgm-exporter does), "instance" fields differ per instance, and
"non_mig" fields are absent for MIG GPUs (NVML reports no GPU utilization there).

Backends do not hand-write one block per field: each declares, per field, how to obtain the raw
value (`Readers`), and `read_fields` walks the catalogue once, in this order, applying the rules
every backend shares (see `read_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Union

from gpufleet.exposition import DCGM_BLANK_THRESHOLD  # blank DCGM values are not data


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "gauge" | "counter"
    help: str
    scope: str = "device"  # "device" | "instance" | "non_mig"


_FIELDS = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "non_mig"),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "non_mig"),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "non_mig"),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "non_mig"),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    Field("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event (throttle) reasons, a bitmask of NVML clocksEventReason flags."),
    Field("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).", "instance"),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "instance"),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "instance"),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "instance"),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    # Profiling fields (DCGM's DCP group). NVML has no DCP counters; the NVML backend reads them
    # through GPM (GPU Performance Monitoring, Hopper and later: exporter/backends/gpm.py) and
    # leaves them out on GPUs without it. Ratios 0-1 and bytes per second, as dcgm-exporter.
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", "instance"),
    Field("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", "instance"),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.", "instance"),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", "instance"),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data.", "instance"),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", "instance"),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", "instance"),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", "instance"),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "instance"),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "instance"),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.", "instance"),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink, not including protocol headers, in bytes per second.", "instance"),
)

FIELDS: dict[str, Field] = {f.name: f for f in _FIELDS}

# the label of dcgm-exporter's label-type field, the driver version (snapshot._dcgm_labels writes dcgm-exporter's label
# order: fixed labels, MIG labels, Hostname, then label-type fields)
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"


def is_blank(value: float) -> bool:
    """True when a value is one of DCGM's int64 blank sentinels rather than a measurement."""
    return value >= DCGM_BLANK_THRESHOLD


# --- reading the catalogue -------------------------------------------------------------------

# A Source answers with a raw value, or None when the GPU has no value for it. A Pick turns that
# raw answer into one field's value (None: the answer is the value; a Pick returning None: this
# field is absent). Several fields may share one Source, so one call answers them all.
Source = Callable[..., Any]
Pick = Union[Callable[[Any], Any], None]
Reader = Union[Source, tuple[Source, Pick]]
Readers = Mapping[str, Reader]
# One step per source: (source, field name) when its answer is that one field's value (most
# fields; kept apart because it is the cheap case), else (source, ((field name, pick), ...)).
Plan = tuple[tuple[Source, Union[str, tuple[tuple[str, Pick], ...]]], ...]


def plan(readers: Readers, scopes: Collection[str]) -> Plan:
    """The catalogue fields of `scopes` that `readers` knows, in catalogue order, by source.

    Built once per backend and scope set, so a poll pays nothing for the lookup. A reader for
    a name outside the catalogue is a typo that would publish nothing: refused.
    """
    unknown = sorted(set(readers) - set(FIELDS))
    if unknown:
        raise ValueError(f"readers for fields not in the catalogue: {', '.join(unknown)}")
    steps: dict[Source, list[tuple[str, Pick]]] = {}
    for f in _FIELDS:
        reader = readers.get(f.name)
        if reader is None or f.scope not in scopes:
            continue
        source, pick = reader if isinstance(reader, tuple) else (reader, None)
        steps.setdefault(source, []).append((f.name, pick))
    return tuple(
        (source, picks[0][0]) if len(picks) == 1 and picks[0][1] is None else (source, tuple(picks))
        for source, picks in steps.items()
    )


def read_fields(fields_plan: Plan, *args: Any) -> dict[str, float]:
    """One reading: every source in the plan asked once with `args`, each answer picked apart.

    The shared rules live here, once: a source or pick that answers None leaves its field
    absent (a field the GPU does not support is never reported as 0), and each source is
    called at most once however many fields it answers.
    """
    out: dict[str, float] = {}
    for source, fields in fields_plan:
        raw = source(*args)
        if raw is None:
            continue
        if fields.__class__ is str:
            out[fields] = raw
            continue
        for name, pick in fields:
            value = raw if pick is None else pick(raw)
            if value is not None:
                out[name] = value
    return out
