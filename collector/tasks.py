"""Independent tasks run in this process or on a Dask cluster, with the same code either way.

Rebuilds and long backfills split into tasks that read the store's immutable files and write
files of their own (atomically, so a task killed half-way leaves nothing behind and a rerun
redoes only what is missing). `TaskRunner.map` runs them (`ordered` too, for results taken one by
one as they are done, as a backfill commits each chunk): in-process when no scheduler is set,
else on the Dask distributed scheduler at `scheduler` (a site's own, under Slurm with
dask-jobqueue or Kubernetes with the Dask operator; see the README), whose workers need gpufleet
installed. A failed task is retried `retries` times; a worker that dies mid-task has its tasks
run again elsewhere by Dask. Progress goes to `progress(done, total)` and the log.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0  # progress in the log at most this often (and at the end)


class TaskError(Exception):
    """A task failed on every try; the message names the task and the last error."""


@dataclass
class TaskRunner:
    scheduler: str = ""  # "tcp://host:8786": a Dask scheduler; "": this process
    retries: int = 2
    name: str = "tasks"  # what the log lines and task keys say
    progress: Callable[[int, int], None] | None = None
    connect_timeout_s: float = 30.0

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], *, label: Callable[[Any], str] = str) -> list[Any]:
        """fn(item) for every item, results in the items' order. `fn` must be a module-level
        function (Dask sends it to the workers by reference)."""
        items = list(items)
        if not items:
            return []
        if not self.scheduler:
            return list(self.ordered(fn, items, label=label))
        return self._dask(fn, items, label, _Progress(self.name, len(items), self.progress))

    def _local(self, fn: Callable[[Any], Any], item: Any, label: Callable[[Any], str]) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return fn(item)
            except Exception as e:  # noqa: BLE001 - any failure of a task is retried, then reported
                if attempt == self.retries:
                    raise TaskError(f"{self.name}: task {label(item)} failed {attempt + 1} times; last: {type(e).__name__}: {e}") from e
                log.warning("%s: task %s failed (%s: %s), retrying", self.name, label(item), type(e).__name__, e)
        raise AssertionError("unreachable")

    def ordered(self, fn: Callable[[Any], Any], items: Sequence[Any], *, label: Callable[[Any], str] = str,
                ahead: int = 0) -> Iterator[Any]:
        """fn(item) for every item, yielded in the items' order. On Dask at most `ahead` tasks
        (default: two per worker thread) are submitted and not yet taken, so what is held waiting
        is `ahead` results, never all of them; in-process one task runs at a time. Closing the
        iterator early cancels the tasks not taken."""
        items = list(items)
        if not items:
            return
        tick = _Progress(self.name, len(items), self.progress)
        if not self.scheduler:
            for item in items:
                result = self._local(fn, item, label)
                tick.step()
                yield result
            return
        client = self._client()
        waiting: deque[tuple[Any, Any]] = deque()  # (item, future), in the items' order
        try:
            if ahead < 1:
                threads = sum(w.get("nthreads", 1) for w in client.scheduler_info().get("workers", {}).values())
                ahead = max(2, 2 * threads)
            todo = iter(enumerate(items))

            def submit() -> None:
                for i, item in todo:
                    waiting.append((item, client.submit(fn, item, key=self._key(label, item, i), retries=self.retries, pure=False)))
                    return

            for _ in range(ahead):
                submit()
            while waiting:
                item, future = waiting.popleft()
                try:
                    result = future.result()
                except Exception as e:  # noqa: BLE001 - the task's own error, after Dask's retries
                    raise self._failed_on_dask(label(item), e) from None
                future.release()
                submit()
                tick.step()
                yield result
        finally:
            for _, future in waiting:
                future.cancel()
            client.close()

    def _key(self, label: Callable[[Any], str], item: Any, i: int) -> str:
        """A task's Dask key: what the scheduler's logs and dashboard name it by."""
        return f"{self.name}-{label(item)}-{i}"

    def _failed_on_dask(self, label: str, e: BaseException) -> TaskError:
        return TaskError(f"{self.name}: task {label} failed {self.retries + 1} times on Dask; last: {type(e).__name__}: {e}")

    def _client(self) -> Any:
        try:
            from distributed import Client
        except ImportError as e:
            raise TaskError(f"{self.name}: a Dask scheduler is set ({self.scheduler}) but Dask is not installed: "
                            f"pip install 'gpufleet[dask]' ({e})") from None
        try:
            return Client(self.scheduler, timeout=self.connect_timeout_s, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise TaskError(f"{self.name}: cannot reach the Dask scheduler at {self.scheduler}: {e}") from None

    def _dask(self, fn: Callable[[Any], Any], items: list[Any], label: Callable[[Any], str], tick: "_Progress") -> list[Any]:
        client = self._client()  # says so when Dask is not installed
        from distributed import as_completed

        try:
            keys = [self._key(label, item, i) for i, item in enumerate(items)]
            futures = client.map(fn, items, key=keys, retries=self.retries, pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            out: list[Any] = [None] * len(items)
            for future in as_completed(futures, loop=client.loop, raise_errors=False):
                i = index[future.key]
                if future.status == "error":
                    raise self._failed_on_dask(label(items[i]), future.exception())
                out[i] = future.result()
                tick.step()
            return out
        finally:
            client.close()


class _Progress:
    def __init__(self, name: str, total: int, callback: Callable[[int, int], None] | None) -> None:
        self.name, self.total, self.callback = name, total, callback
        self.done, self.logged = 0, time.monotonic()

    def step(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total)
        now = time.monotonic()
        if self.done == self.total or now - self.logged >= LOG_EVERY_S:
            log.info("%s: %d of %d tasks done", self.name, self.done, self.total)
            self.logged = now
