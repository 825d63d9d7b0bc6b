"""What an analysis is asked: a window, filters, and the thresholds that give numbers meaning.

Defaults, and why:
- `max_gap` 30 s (2x a 15 s scrape): a sample stands for the time until the next one, but a
  missing scrape is "no data", never idle and never busy; beyond 2x the interval a gap is real.
- `idle_threshold` 5 % GPU utilization: 0 % misses GPUs that a monitoring sidecar or a stray
  kernel touches now and then; jobs doing useful work sit far above 5 %.
- `idle_min_duration` 30 min: data loading, checkpointing and a paused notebook cell are short;
  half an hour of nothing is a held GPU, not a pause. (jobstats alerts after 1 h at 0 %.)
- `retire_after` 7 days: a GPU no longer seen still counts as capacity (with no data: lost, or
  its exporter down) until then; the inventory cannot tell a silent GPU from a removed one, and a
  week keeps a silent GPU visible for a whole weekly report.
- prices: $/GPU-hour by model (analytics/data/prices.csv, editable in config); a model without a
  price gives money "unknown", never $0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Mapping

from gpufleet.collector.config import ANALYTICS_SHARED, refuse_retired_analytics
from gpufleet.config import ConfigError, Option, number, section, string, table

DIMENSIONS = ("gpu", "host", "model", "cluster", "partition", "account", "user_name", "job", "fleet")


@dataclass(frozen=True)
class Filters:
    """Optional narrowing; None means everything. Values reach SQL only as bound parameters."""

    cluster: str | None = None
    account: str | None = None
    user_name: str | None = None
    model: str | None = None
    partition: str | None = None
    # one job, by its key as the store holds it (Slurm's job id, 123_4 for an array task; a pod's
    # uid): a job's report, which then reads that job's GPUs only; or several keys (a tuple): the
    # policy's efficiency notes of one round, read in one analysis
    job_key: str | tuple[str, ...] | None = None

    def bind(self) -> dict[str, Any]:
        """The filters as the analytics' SQL binds them (sql.JOB_FILTERS and the samples' filters); the job filter as a
        list of keys ($job_keys)."""
        return {"cluster": self.cluster, "model": self.model, "account": self.account, "user_name": self.user_name,
                "partition": self.partition, "job_keys": None if self.job_key is None else list(self.values("job_key"))}

    def values(self, name: str) -> tuple[str, ...]:
        """The values the filter `name` (a field) keeps, as a tuple (one, or the job filter's several; empty: not set)."""
        want = getattr(self, name)
        return () if want is None else (want,) if isinstance(want, str) else tuple(want)

    def keeps(self, name: str, value: Any) -> bool:
        """Does the filter `name` (a field) keep a row whose `name` is `value`? (True where it is not set.)"""
        return getattr(self, name) is None or value in self.values(name)


@dataclass(frozen=True)
class Params:
    start: datetime  # naive UTC, inclusive
    end: datetime  # naive UTC, exclusive
    filters: Filters = field(default_factory=Filters)
    max_gap: timedelta = timedelta(seconds=30)
    idle_threshold: float = 5.0  # percent
    idle_min_duration: timedelta = timedelta(minutes=30)
    retire_after: timedelta = timedelta(days=7)
    prices: Mapping[str, float] = field(default_factory=dict)  # model -> $/GPU-hour (overrides)
    mfu_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"window end {self.end.isoformat()} must be after start {self.start.isoformat()}")

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    def previous(self) -> "Params":
        """The window of the same length just before this one (for trends)."""
        length = self.end - self.start
        return replace(self, start=self.start - length, end=self.start)


OPTIONS = ANALYTICS_SHARED + (  # the facts' parameters and the rebuilds' scheduler: the collector's too
    Option("gpu_retire_after_hours", 168.0, "a number of hours > 0 (a GPU unseen this long is no longer capacity)", number(0)),
    Option("mfu_dtype", "bf16", "one of bf16, fp16, tf32, fp8, fp64", lambda v: v in ("bf16", "fp16", "tf32", "fp8", "fp64")),
    Option("prices", {}, "a table of GPU model -> $ per GPU-hour", lambda v: isinstance(v, dict) and all(number(0, inclusive=True)(x) for x in v.values())),
    Option("store", "", "the store directory (default: [collector] store)", string),
    Option("states", {}, "a table ([analytics.states]: the thresholds of where a job's time goes)", table),
)


def section_options() -> tuple[Any, ...]:
    """Every option of the [analytics] section: these plus each figure module's own - named once,
    for the validation below and the generated configuration reference (docs/build.py)."""
    from gpufleet.analytics import fairness, reliability

    return OPTIONS + fairness.OPTIONS + reliability.OPTIONS


def analytics_options(doc: Mapping[str, Any], path: Any) -> dict[str, Any]:
    """The validated [analytics] section (a retired key refused with what replaced it)."""
    if isinstance(doc.get("analytics"), dict):
        refuse_retired_analytics(doc["analytics"], path)
    return section(doc, "analytics", section_options(), path)


def store_path(doc: Mapping[str, Any], path: Any, *preferred: str | None) -> Path:
    """The store the readers open, decided in one place: the first of `preferred` that is set (a
    --store flag, [dashboard] store), else [analytics] store, else [collector] store."""
    from gpufleet.collector import config as collector_config

    chosen = next((p for p in preferred if p), None) or analytics_options(doc, path)["store"]
    return Path(chosen or collector_config.load(doc, path)["store"])


def from_config(doc: Mapping[str, Any], path: Any, start: datetime, end: datetime, filters: Filters | None = None) -> Params:
    opts = analytics_options(doc, path)
    try:
        return Params(
            start=start,
            end=end,
            filters=filters or Filters(),
            max_gap=timedelta(seconds=opts["max_gap_seconds"]),
            idle_threshold=float(opts["idle_threshold_percent"]),
            idle_min_duration=timedelta(seconds=opts["idle_min_duration_seconds"]),
            retire_after=timedelta(hours=opts["gpu_retire_after_hours"]),
            prices={str(k): float(v) for k, v in opts["prices"].items()},
            mfu_dtype=opts["mfu_dtype"],
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
