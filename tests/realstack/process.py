"""Start, watch and stop the daemons the harness owns.

Every daemon runs in the foreground as our child, in its own session, with its output in a log
file. Stopping one is by its own pid / process group only (never by name), so a developer's own
Prometheus or a system slurmd on the same machine is never touched.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HarnessError(RuntimeError):
    """A real component was there but did not come up or misbehaved (a test error, not a skip)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path | str, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ with sbin on PATH (daemons and admin tools live there) plus `extra`."""
    env = dict(os.environ)
    path = env.get("PATH", "")
    env["PATH"] = f"{path}:{SBIN_PATH}" if path else SBIN_PATH
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    check: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a short command; on failure raise HarnessError naming the command and its stderr."""
    try:
        proc = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{' '.join(argv)} timed out after {timeout}s") from exc
    if check and proc.returncode != 0:
        err = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise HarnessError(f"{' '.join(argv)} exited {proc.returncode}:\n{err}")
    return proc


class Daemon:
    """One long-running process we started: its argv, log file and Popen."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Daemon":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s: %s", self.name, " ".join(self.argv))
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # own process group: stop() can reach its children
            )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise HarnessError(
                f"{self.name} exited with status {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{tail(self.log_path)}"
            )

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, wait up to `timeout`, then SIGKILL its whole process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %s) ignored SIGTERM for %ss; killing", self.name, self.pid, timeout)
        # The group id is the daemon's own pid (start_new_session): kill what it left behind.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %s) survived SIGKILL", self.name, self.pid)


def wait_for(
    what: str,
    predicate: Callable[[], bool],
    *,
    timeout: float,
    daemons: Sequence[Daemon] = (),
    interval: float = 0.1,
) -> float:
    """Poll `predicate` until true; fail fast if one of `daemons` died. Returns seconds waited."""
    start = time.monotonic()
    deadline = start + timeout
    last_exc: Exception | None = None
    while True:
        for d in daemons:
            d.check_alive()
        try:
            if predicate():
                return time.monotonic() - start
            last_exc = None
        except (OSError, HarnessError, ValueError) as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.name} ({d.log_path}):\n{tail(d.log_path)}" for d in daemons)
            detail = f" (last error: {last_exc})" if last_exc else ""
            raise HarnessError(f"timed out after {timeout}s waiting for {what}{detail}\n{logs}")
        time.sleep(interval)


def kill_marked(marker: str) -> list[int]:
    """SIGKILL every process whose environment contains the exact entry `marker` ("KEY=value").

    Used for processes our daemons spawned outside their process group (slurmstepd and job
    processes set up their own sessions): they inherit the marker from the daemon or from the
    sbatch call, and nothing else on the machine carries it.
    """
    needle = marker.encode()
    me = os.getpid()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    _wait_gone(killed, timeout=5)
    return killed


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    """Wait until killed processes are reaped (init does that for orphans), so that a pgrep right
    after a teardown sees nothing."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
