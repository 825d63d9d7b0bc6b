"""Prometheus text exposition (format 0.0.4): the vocabulary the exporter writes and the collector
reads, kept in the kernel so neither imports the other. Written by hand for one reason.

prometheus_client's writer renames a counter family `X` to `X_total` in its HELP/TYPE lines,
but dcgm-exporter publishes counters such as `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` without the
suffix, and every rule and dashboard in the ecosystem uses those names. So families are written
here exactly as named; tests check the output with prometheus_client's parser and
`promtool check metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

Labels = tuple[tuple[str, str], ...]

# DCGM reports "blank" (not available) as int64 values near 2**63; such values are not data.
DCGM_BLANK_THRESHOLD = 9223372036854775792


@dataclass
class Family:
    name: str
    kind: str  # "gauge" | "counter" | "info"-as-gauge
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, labels: Labels, value: float) -> None:
        self.samples.append((labels, value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**63):
        return str(int(v))
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


@lru_cache(maxsize=65536)
def _label_text(labels: Labels) -> str:
    """`{k="v",...}` for a label set; cached because each GPU's labels repeat in every family."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels) + "}"


def render(families: Iterable[Family]) -> bytes:
    """Text exposition of the families that have samples (empty families are left out)."""
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.kind}\n")
        for labels, value in fam.samples:
            out.append(f"{fam.name}{_label_text(labels)} {format_value(value)}\n")
    return "".join(out).encode()
