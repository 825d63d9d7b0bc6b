"""Child processes: stop one politely, then firmly; and let one die with its parent. A service's
own stop: on SIGINT or SIGTERM, whichever thread the signal lands on. The cycle collector paused
over a computation that builds millions of objects."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator


def terminate(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout` s, then SIGKILL; always reaps the child."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


PARENT_PID_ENV = "GPUFLEET_EXIT_WITH_PARENT"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a gpufleet child that should stop when this process dies, even by SIGKILL
    (see exit_with_parent); start it from the main thread: Linux ties the signal to the thread."""
    return {**os.environ, PARENT_PID_ENV: str(os.getpid()), **extra}


def exit_with_parent() -> bool:
    """If started by child_env(): ask Linux for SIGTERM when the parent dies (prctl
    PR_SET_PDEATHSIG), and stop now if it is already gone. True when the request is in place."""
    wanted = os.environ.pop(PARENT_PID_ENV, None)
    if not wanted or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if str(os.getppid()) != wanted:  # the parent died before the request: nobody will signal us
        os.kill(os.getpid(), signal.SIGTERM)
    return True


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SIGNAL_POLL_S = 0.5  # how soon a signal delivered to another thread is acted on


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (call from the main thread: Python runs handlers there)."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    return stop


def wait_until_stopped(stop: threading.Event) -> None:
    """Block the main thread until `stop` is set, waking every SIGNAL_POLL_S. The kernel may deliver
    a process' SIGTERM to any of its threads (a scheduler's, a library's); Python then runs the
    handler only when the main thread next runs Python code, which an untimed wait never does: a
    `gpufleet collect` under load ignored a SIGTERM until a second one came."""
    while not stop.wait(SIGNAL_POLL_S):
        pass


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off inside the block, back on after it where it was on: a
    computation that keeps building objects (the reliability report's ~100,000 attempts and
    chains at 100,000 GPUs) triggers full collections that walk every live object, ~3 s of its
    ~10 s; reference counting still frees everything that is not a cycle, and the next
    collection after the block finds the cycles it made. Nested or in several threads at once,
    the collector is back on when the first block that found it on ends."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
