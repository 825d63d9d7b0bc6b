"""`gpufleet collect --backfill START END`: fill a past window, chunk by chunk, with a progress bar.

Only sources that can read the past take part (Prometheus API, sacct); scraping cannot. Each
chunk is committed on its own, so an interrupted backfill keeps what it finished, and re-running
it skips the chunks already stored (their batch keys are known). A source that reads whole
chunks once complete (the Prometheus API) names the chunks of the window it leaves out and when
they can be read; a backfill that could read none of its window fails, saying so.

With `[analytics] dask_scheduler` set, a source whose reads need only its settings (the
Prometheus API: `reads_anywhere`) reads its chunks as tasks on the Dask cluster, one task per
chunk (the unit a batch key names, so a re-run is a no-op as here); this process commits each
chunk's batch in order as it comes, with a bounded number of chunks read ahead
(TaskRunner.ordered). sacct stays here: its command runs where Slurm's client is.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Iterator, TextIO

from gpufleet.collector.schema import Batch
from gpufleet.collector.service import Collector
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.tasks import TaskError

log = logging.getLogger(__name__)


def progress_bar(done: int, total: int, label: str, started: float, width: int = 30) -> str:
    frac = done / total if total else 1.0
    filled = int(round(frac * width))
    elapsed = time.monotonic() - started
    eta = f", {elapsed / done * (total - done):.0f}s left" if done and done < total else ""
    return f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} ({frac:.0%}{eta})"


def read_chunk(task: tuple[Any, datetime, datetime]) -> Batch:
    """One backfill task: the batch of chunk (lo, hi] read by `source` (module level: a Dask
    worker imports it by reference and gets the source's settings with the task)."""
    source, lo, hi = task
    return source.read_window(lo, hi)


def _batches(collector: Collector, source: Any, windows: list[tuple[datetime, datetime]]) -> tuple[Iterator[Batch], str]:
    """The windows' batches in order, and where they are read (a single chunk is read here:
    there is nothing to spread)."""
    runner = collector.tasks
    if runner is not None and runner.scheduler and getattr(source, "reads_anywhere", False) and len(windows) > 1:
        runner = dataclasses.replace(runner, name=f"backfill-{source.name}", progress=None)
        chunks = [(source, lo, hi) for lo, hi in windows]
        return runner.ordered(read_chunk, chunks, label=lambda t: t[1].strftime("%Y%m%dT%H%M%S")), f" on {runner.scheduler}"
    # a source that reads ahead (the Prometheus API: parallel queries) reads the windows in order
    if hasattr(source, "read_windows"):
        return source.read_windows(windows), ""
    return (source.read_window(lo, hi) for lo, hi in windows), ""


def backfill(collector: Collector, start: datetime, end: datetime, *, out: TextIO) -> bool:
    able = [s.source for s in collector.sources if hasattr(s.source, "backfill_windows")]
    if not able:
        log.error("no configured source can backfill (scraping reads only the present): configure [collector.prometheus] url or [collector.sacct]")
        return False
    ok = True
    for source in able:
        windows = list(source.backfill_windows(start, end))
        skipped = source.skipped_windows(start, end) if hasattr(source, "skipped_windows") else []
        if skipped:
            ready = max(r for *_, r in skipped)
            named = ", ".join(f"{lo.isoformat()}..{hi.isoformat()}" for lo, hi, _ in skipped[:3]) + (
                f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
            msg = (f"backfill {source.name}: {len(skipped)} chunk(s) not read: {named} UTC; chunks are read whole once complete "
                   f"(older than lag_seconds): all can be read from {ready.isoformat()} UTC (the service reads them then, "
                   f"or re-run --backfill with END at a chunk boundary after that)")
            out.write(msg + "\n")
            log.warning("%s", msg)
            if not windows:
                log.error("backfill %s: nothing of %s..%s can be read yet", source.name, start.isoformat(), end.isoformat())
                ok = False
        started = time.monotonic()
        batches, where = _batches(collector, source, windows)
        try:
            for i, (lo, hi) in enumerate(windows, 1):
                try:
                    collector.commit(source.name, [next(batches)])
                except (SourceError, TaskError) as e:
                    out.write("\n")
                    log.error("backfill of %s failed at %s..%s: %s", source.name, lo.isoformat(), hi.isoformat(), e)
                    ok = False
                    break
                out.write(progress_bar(i, len(windows), f"backfill {source.name}{where}", started))
                out.flush()
        finally:
            batches.close()  # stops reading ahead
        out.write("\n")
    return ok
