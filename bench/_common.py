"""Shared pieces of the benchmarks: result tables, percentiles, child processes, /proc readings."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- results ---


@dataclass
class Row:
    figure: str
    measured: str
    goal: str = ""
    ok: bool | None = None  # None: a reference/context row with no goal

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "FAIL")


@dataclass
class Table:
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: str, measured: str, goal: str = "", ok: bool | None = None) -> None:
        self.rows.append(Row(figure, measured, goal, ok))

    @property
    def failed(self) -> bool:
        return any(r.ok is False for r in self.rows)

    def render(self) -> str:
        head = ("figure", "measured", "goal", "result")
        cells = [head] + [(r.figure, r.measured, r.goal, r.verdict) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(4)]
        line = lambda c: "  ".join(s.ljust(w) for s, w in zip(c, widths)).rstrip()  # noqa: E731
        rule = "  ".join("-" * w for w in widths)
        out = [f"== {self.title} ==", line(head), rule] + [line(c) for c in cells[1:]]
        out += [f"  * {n}" for n in self.notes]
        return "\n".join(out)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: expected a number") from None


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- /proc ---


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def proc_kib(pid: int, key: str) -> int:
    return int(proc_status(pid)[key].split()[0])


# --- child processes ---


# `gpufleet ARGS` as the console script runs it, for run_python
GPUFLEET_COMMAND = "import sys; from gpufleet.cli import main; sys.exit(main(sys.argv[1:]))"


# A checkout of the code before (a git worktree: `git worktree add /tmp/before HEAD~3`), run beside this one's in
# alternating processes by the benches that take it (analyze): the same command, the same store, the ratio measured in one run
BEFORE_ENV = "GPUFLEET_BENCH_BEFORE"


def before_checkout() -> Path | None:
    """The checkout GPUFLEET_BENCH_BEFORE names (None: unset); one without a pyproject.toml is refused, named."""
    value = os.environ.get(BEFORE_ENV, "").strip()
    if not value:
        return None
    root = Path(value).resolve()
    if not (root / "pyproject.toml").is_file():
        raise ValueError(f"{BEFORE_ENV}={value}: expected a checkout of gpufleet (a folder with pyproject.toml)")
    return root


def in_checkout(code: str, root: Path) -> str:
    """`code` importing gpufleet.* from the checkout at `root`. Its folders are not a package tree (pyproject's
    package-dir maps gpufleet.analytics to analytics/, ...), so PYTHONPATH alone finds root's gpufleet/__init__.py
    and then this environment's editable install for the rest - this checkout's code, an A/B of the code with
    itself. A finder first in sys.meta_path maps every package-dir entry to root's folder."""
    import tomllib

    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {name: str(root / folder) for name, folder in dirs.items()}
    prelude = ("import sys, importlib.util\n"
               f"_DIRS = {mapping!r}\n"
               "class _Checkout:\n"
               "    @staticmethod\n"
               "    def find_spec(name, path=None, target=None):\n"
               "        d = _DIRS.get(name)\n"
               "        return None if d is None else importlib.util.spec_from_file_location(name, d + '/__init__.py', "
               "submodule_search_locations=[d])\n"
               "sys.meta_path.insert(0, _Checkout)\n")
    return prelude + code


# The child's own peak RSS, written at its exit to the file PEAK_ENV names: wait4's ru_maxrss is not it - Linux keeps the
# larger of the old and the new image's high-water mark across exec, so a child spawned by a bench that had just generated
# its store in-process reported the bench's 1.25 GiB for every run (VmHWM is the new image's alone)
PEAK_ENV = "GPUFLEET_BENCH_PEAK_FILE"
_PEAK_PRELUDE = ("import atexit as _atexit, os as _os\n"
                 "def _peak():\n"
                 "    with open('/proc/self/status') as f, open(_os.environ['" + PEAK_ENV + "'], 'w') as out:\n"
                 "        out.write(next(l.split()[1] for l in f if l.startswith('VmHWM:')))\n"
                 "_atexit.register(_peak)\n")


def run_python(code: str, args: list[str], checkout: Path | None = None) -> tuple[float, float, float, bytes]:
    """`python -c code args` in a process of its own (GPUFLEET_COMMAND: a `gpufleet` command), with gpufleet from
    `checkout` (default this one: in_checkout): wall s, CPU s (user + system), peak RSS GiB (its VmHWM) and its output;
    a failure raises, naming the command."""
    import tempfile

    given, code = code, _PEAK_PRELUDE + code
    with tempfile.NamedTemporaryFile("r", prefix="gpufleet-bench-peak-") as peak:
        t0 = time.perf_counter()
        argv = [sys.executable, "-c", code if checkout is None else in_checkout(code, checkout), *args]
        p = subprocess.Popen(argv, cwd=checkout or ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env={**os.environ, PEAK_ENV: peak.name})
        out = p.stdout.read() if p.stdout else b""
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise RuntimeError(f"python -c {given!r} {' '.join(args)} exited {p.returncode}")
        kib = peak.read().strip()
    if not kib.isdigit():
        raise RuntimeError(f"python -c {given!r} {' '.join(args)} wrote no peak RSS to {PEAK_ENV} (read {kib!r}): expected its VmHWM in kB")
    return wall, usage.ru_utime + usage.ru_stime, int(kib) / 2**20, out


def measure_child(module: str, args: list[str], timeout: float) -> dict:
    """Run a measuring child, `python -m <module> <args>`, in a process of its own (its peak RSS is
    its own) and return the JSON document it printed on its line marked RESULT (DuckDB may draw a
    progress bar on stdout too)."""
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{module} exited {r.returncode}")
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("RESULT ")][-1].removeprefix("RESULT "))


def raw_side_fits(knob: str, samples: int, bytes_per_sample: int) -> tuple[bool, str]:
    """Whether to run a bench's raw-sample side: the environment variable `knob` says 1 or 0, or
    auto (the default): only when its peak RSS, estimated at bytes_per_sample, fits in 80 % of
    MemAvailable. (run it, why not)."""
    value = os.environ.get(knob, "auto")
    if value in ("0", "1"):
        return value == "1", f"{knob}=0"
    need = samples * bytes_per_sample / 2**30
    avail = next((int(line.split()[1]) / 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemAvailable:")), 0.0)
    if need > 0.8 * avail:
        return False, f"its peak RSS would be about {need:.0f} GiB ({bytes_per_sample} B per sample), over 80 % of the {avail:.0f} GiB available"
    return True, ""


def free_port() -> int:
    """A free TCP port on loopback, for a child server to listen on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_children: list[subprocess.Popen] = []


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)  # own session: reaches anything it spawned too
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=5)


def stop_all_children() -> None:
    while _children:
        _stop(_children.pop())


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=log.parent, env=env,
                         start_new_session=True)
    _children.append(p)
    return p


@contextmanager
def local_dask(tmp: Path, workers: int) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """A `dask scheduler` and `workers` single-threaded `dask worker` processes on loopback (logs
    in tmp): (the scheduler's address, the worker processes), stopped on exit."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_spawn([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], tmp / "scheduler.log")]
    try:
        for i in range(workers):
            procs.append(_spawn([sys.executable, "-m", "dask", "worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                                 "--no-dashboard", "--memory-limit", "0", "--local-directory", str(tmp / f"w{i}"), "--name", f"w{i}"],
                                tmp / f"worker-{i}.log"))
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(address, timeout=5, set_as_default=False) as c:
                    if len(c.scheduler_info()["workers"]) == workers:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Dask cluster did not start: see {tmp}")
            time.sleep(0.5)
        yield address, procs[1:]
    finally:
        for p in reversed(procs):
            _stop(p)
            if p in _children:
                _children.remove(p)


class Child:
    """A child process in its own session that prints one line naming its port when ready.

    Used as a context manager; it is stopped (SIGTERM, then SIGKILL) on exit whatever happens.
    stderr goes to a temp file, shown when the child fails to start.
    """

    def __init__(self, argv: list[str], ready: str, *, timeout: float = 30.0, cwd: Path | None = None):
        self.argv, self.ready, self.timeout, self.cwd = argv, re.compile(ready), timeout, cwd
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._err = tempfile.TemporaryFile()

    def __enter__(self) -> Child:
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL,
            cwd=self.cwd, start_new_session=True,
        )
        _children.append(self.proc)
        try:
            self.port = self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        buf = b""
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                buf += chunk
                m = self.ready.search(buf.decode(errors="replace"))
                if m:
                    return int(m.group("port"))
                if not chunk and self.proc.poll() is not None:
                    break
            elif self.proc.poll() is not None:
                break
        raise RuntimeError(f"{' '.join(self.argv)} did not get ready (exit {self.proc.poll()}):\n{self.stderr_tail()}\nstdout: {buf!r}")

    def stderr_tail(self, n: int = 20) -> str:
        self._err.seek(0)
        return "\n".join(self._err.read().decode(errors="replace").splitlines()[-n:])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _stop(self.proc)
            if self.proc in _children:
                _children.remove(self.proc)
            if self.proc.stdout:
                self.proc.stdout.close()
        self._err.close()


# A same-stack reference: Python's http.server serving static files over keep-alive HTTP/1.1.
# With nodelay, the handler sets TCP_NODELAY (StreamRequestHandler.disable_nagle_algorithm).
STATIC_SERVER = r"""
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = sys.argv[2] == "nodelay"
    def log_message(self, *a): pass
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
srv = S(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
print(f"static server on port {srv.server_address[1]}", flush=True)
srv.serve_forever()
"""


def static_server(directory: Path, *, nodelay: bool = False) -> Child:
    return Child([sys.executable, "-c", STATIC_SERVER, str(directory), "nodelay" if nodelay else "stock"], r"port (?P<port>\d+)")


def exporter(args: list[str], workdir: Path) -> Child:
    """`gpufleet exporter ARGS --listen 127.0.0.1:0`; the port comes from its "metrics at" line."""
    exe = Path(sys.executable).with_name("gpufleet")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpufleet.cli"]
    if os.environ.get("GPUFLEET_BENCH_EXPORTER"):
        argv = shlex.split(os.environ["GPUFLEET_BENCH_EXPORTER"])
    return Child(argv + ["exporter", *args, "--listen", "127.0.0.1:0"], r"metrics at http://[^:]+:(?P<port>\d+)/metrics", cwd=workdir)
