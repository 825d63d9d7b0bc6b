"""Whose figures they are: the filters a figure is narrowed by, said once for every surface.
(Apart from core.py so that figure modules below it - fairness - can say it too.)"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

# The filters that select jobs (account, user, partition, job): under one, a figure is the selected
# jobs' share, and what no job owns (capacity, stranded time) is not attributable to them.
JOB_FILTER_NAMES = {"account": "account", "user_name": "user", "partition": "partition", "job_key": "job"}


def said(value: Any) -> str:
    """A filter's value as people write it: several job keys joined by commas."""
    return ",".join(value) if isinstance(value, tuple) else str(value)


def filter_scope(filters: Any) -> str:
    """"fleet", or the filters a figure is narrowed by, as people write them: "account=datasci, cluster=k8s"."""
    parts = [f"{JOB_FILTER_NAMES.get(k, k)}={said(v)}" for k, v in asdict(filters).items() if v is not None]
    return ", ".join(parts) if parts else "fleet"


def not_attributable_reason(filters: Any) -> str | None:
    """Why capacity and stranded time are not shown under a job filter (None: no job filter)."""
    named = [JOB_FILTER_NAMES[k] for k in JOB_FILTER_NAMES if getattr(filters, k) is not None]
    if not named:
        return None
    return f"unallocated capacity has no {' or '.join(named)}: capacity and stranded time are not attributable to {filter_scope(filters)}"


# The job filters that do not narrow a pool of capacity shared by everyone (queue gaps): they pick the jobs listed
POOL_WIDE_FILTERS = ("account", "user_name", "job_key")


def pool_filter_note(filters: Any) -> str | None:
    """What an account, user or job filter does to the queue gaps (None: none set): the pools stay everyone's, the filter
    picks the waiting jobs listed."""
    named = {k: getattr(filters, k) for k in POOL_WIDE_FILTERS if getattr(filters, k) is not None}
    if not named:
        return None
    return (f"the pools are everyone's free GPUs and queue ({' or '.join(JOB_FILTER_NAMES[k] for k in named)} filters do not narrow "
            f"them); the jobs listed are {', '.join(f'{JOB_FILTER_NAMES[k]}={said(v)}' for k, v in named.items())}'s")


def _model_filter_note(filters: Any, why: str, after: str = "") -> str | None:
    """"`why`: the filter model=X does not narrow it`after`" for a figure a GPU model filter does not narrow (None: none set)."""
    if getattr(filters, "model", None) is None:
        return None
    return f"{why}: the filter model={filters.model} does not narrow it{after}"


def fairness_model_note(filters: Any) -> str | None:
    """Why a GPU model filter does not narrow fairness (None: none set): a team's hours on one model against its entitlement
    to the whole cluster is no comparison."""
    return _model_filter_note(filters, "fairness compares each team's allocations on every GPU model with its entitlement")


def reliability_model_note(filters: Any) -> str | None:
    """Why a GPU model filter does not narrow reliability (None: none set): an attempt is one job's, and its GPUs
    are counted whatever their model (the account, user, partition, job and cluster filters do narrow it)."""
    return _model_filter_note(filters, "reliability counts job attempts with all their GPUs, whatever their model", " (the other filters do)")
