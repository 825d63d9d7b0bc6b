"""`gpufleet collect --backfill START END`: fill a past window, chunk by chunk, with a progress bar.

Only sources that can read the past take part (Prometheus API, sacct); scraping cannot. Each
chunk is committed on its own, so an interrupted backfill keeps what it finished, and re-running
it skips the chunks already stored (their batch keys are known). A source that reads whole
chunks once complete (the Prometheus API) names the chunks of the window it leaves out and when
they can be read; a backfill that could read none of its window fails, saying so.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TextIO

from gpufleet.collector.service import Collector
from gpufleet.collector.sources.base import SourceError

log = logging.getLogger(__name__)


def progress_bar(done: int, total: int, label: str, started: float, width: int = 30) -> str:
    frac = done / total if total else 1.0
    filled = int(round(frac * width))
    elapsed = time.monotonic() - started
    eta = f", {elapsed / done * (total - done):.0f}s left" if done and done < total else ""
    return f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} ({frac:.0%}{eta})"


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
        # a source that reads ahead (the Prometheus API: parallel queries) reads the windows in order
        batches = source.read_windows(windows) if hasattr(source, "read_windows") else (source.read_window(lo, hi) for lo, hi in windows)
        try:
            for i, (lo, hi) in enumerate(windows, 1):
                try:
                    collector.commit(source.name, [next(batches)])
                except SourceError as e:
                    out.write("\n")
                    log.error("backfill of %s failed at %s..%s: %s", source.name, lo.isoformat(), hi.isoformat(), e)
                    ok = False
                    break
                out.write(progress_bar(i, len(windows), f"backfill {source.name}", started))
                out.flush()
        finally:
            batches.close()  # stops reading ahead
        out.write("\n")
    return ok
