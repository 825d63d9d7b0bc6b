"""SacctSource: Slurm job accounting from `sacct`, read in overlapping windows.

How it calls sacct, and why:

- `--allocations` (-X): one line per job allocation (plain jobs, array tasks, het components),
  no steps. Steps are not jobs; reading them only to drop them costs a line per srun. The
  parser still skips steps, so a user-supplied format or extra args that bring them back is fine.
- `--duplicates`: a requeued job shows every record (attempt), each with its own start, end,
  state, exit code and nodes. The jobs table keeps the latest (one row per JobIDRaw), the
  job_attempts table the earlier ones (slurm_parse.split_attempts): reliability classifies each.
- `--parsable2 --noheader --format=<fields>` with `--delimiter=U+001F` (unit separator): job
  names are free text and may contain `|`; nobody types U+001F into a job name. JobName is the
  last field anyway, so a name holding the delimiter is still rejoined unambiguously.
- Times: sacct reads -S/-E and prints Submit/Start/End in its process's local time zone. We run
  it with TZ=<tz> (default UTC) and SLURM_TIME_FORMAT=standard, convert our UTC window into that
  zone and parse its output back from it, so the machine's zone and a site's time format do not
  matter. Set `tz` to the cluster's zone when a wrapper (ssh to a login node) drops TZ.
- Windows: each run reads [watermark - overlap, now]; the first run reads `initial_lookback`.
- `--state=<every state>` (WINDOW_STATES): without a state, slurmdbd selects the jobs eligible
  before the window's end, and a job that starts the instant it is submitted can have no
  eligible time at all (Eligible=Unknown; seen on 22.05 with short jobs submitted to an idle
  node): no window would ever list it, and its GPU-hours would be lost without a
  word. With every state named, slurmdbd selects per state: a job that ran during the window
  (whatever its state now, by start and end), one that ended in it (by end), one pending in it
  (by eligible time). So a RUNNING job is read again by every run until it ends, and its final
  state is read by the run whose window holds its end. Jobs not yet eligible (held, --begin in
  the future) are in no window until they are; they hold no GPU meanwhile. The overlap covers accounting records that reach slurmdbd late (a job
  shows up about a second after it starts; the tasks slurmctld splits off an array record reach
  it 2-5 s after they end, and until then the array's last task reads as a plain job id under the
  same JobIDRaw, which the next read corrects; slurmctld queues records while slurmdbd is down): a
  record later than `overlap` leaves that job RUNNING in the store, so raise `overlap` if your
  slurmdbd has long outages. Long windows (first run, a gap) are read in `max_window` chunks,
  one batch and watermark each, so progress survives a crash.
- GPUs: AllocTRES gres/gpu, which slurmdbd records only when AccountingStorageTRES includes
  gres/gpu. If it does not, a job's TRES name no GPU whatever it held: its GPU count is unknown
  (never 0), said once as unrecognized input with the fix, and filled by the store from
  slurmctld (the slurmrestd source) or the exporters' job mapping. "No GPU TRES" reads as 0 GPUs
  once a record has shown that this accounting names GPUs (remembered in `tracks_gpus`).

GPU indices from `scontrol show job -d` are not turned into allocations here: they are Slurm's
GRES indices (positions in the node's gres.conf), not NVML indices or minor numbers, and the
collector has neither gres.conf nor the minors to map them. The exporter's job map (prolog ->
UUID) is the allocation source for Slurm.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from gpufleet.collector.schema import Batch

from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm_json import jobs_batch, note_gpu_tracking
from gpufleet.collector.sources.slurm_parse import as_tz, parse_sacct, split_attempts
from gpufleet.times import utcnow

UNIT_SEPARATOR = "\x1f"
DEFAULT_FIELDS = (
    "JobIDRaw", "JobID", "Cluster", "User", "Account", "Partition", "QOS", "Submit", "Eligible", "Start",
    "End", "State", "ExitCode", "NNodes", "NodeList", "AllocTRES", "ReqTRES", "JobName",
)
# The base job states (Slurm's enum job_states, PENDING to OUT_OF_MEMORY), and every job state
# sacct -s takes (Slurm 17.11+): asked for by name so that slurmdbd selects a window's jobs by each
# state's own times and not by eligible time alone (see the module docstring)
BASE_JOB_STATES = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
)
WINDOW_STATES = (*BASE_JOB_STATES, "REQUEUED", "RESIZING", "REVOKED")
MAX_PROBLEMS_PER_BATCH = 20
_STORED = object()  # run()/window() without a watermark argument: use watermark_of or memory


class JobWindows:
    """Windows over time for a source of Slurm job records (sacct, slurmrestd): each run reads
    [watermark - overlap, now], the first `initial_lookback`, in `max_window` pieces, one batch
    and watermark each. The class using it has cluster, overlap, initial_lookback, max_window,
    watermark_of, _remembered, watermark_name and read_window(lo, hi, now=...)."""

    def window(self, now: datetime, watermark: str | None | object = _STORED) -> tuple[datetime, datetime, str | None]:
        """(start, end, problem) of the next run, naive UTC seconds. `watermark`: the committed
        value as the caller read it (None: nothing committed yet); default: ask watermark_of."""
        end = now.replace(microsecond=0)
        if watermark is _STORED:
            watermark = self.watermark_of(self.watermark_name) if self.watermark_of else self._remembered
        problem = None
        start = end - self.initial_lookback
        if watermark:
            try:
                start = datetime.fromisoformat(str(watermark)).replace(microsecond=0) - self.overlap
            except ValueError:
                problem = f"watermark {self.watermark_name}={watermark!r} is not an ISO time: reading the last {self.initial_lookback}"
        if start >= end:  # watermark in the future (clock stepped back): still read the overlap
            start = end - self.overlap
        return start, end, problem

    def run(self, now: datetime, watermark: str | None | object = _STORED) -> Iterator[Batch]:
        start, end, problem = self.window(now, watermark)
        for lo, hi in self.backfill_windows(start, end):
            batch = self.read_window(lo, hi, now=now)
            if problem:
                batch.problems, problem = [problem, *batch.problems], None
            batch.watermark = (self.watermark_name, hi.isoformat())
            yield batch
            self._remembered = hi.isoformat()  # the consumer asked for more: it took that batch
        yield from self.after_windows(now)

    def after_windows(self, now: datetime) -> list[Batch]:
        """Batches a run reads after its windows (slurmrestd: slurmctld's current jobs)."""
        return []

    def backfill_windows(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        """[start, end] cut into `max_window` pieces, one read and batch each."""
        start, end = start.replace(microsecond=0), end.replace(microsecond=0)
        out = []
        while start < end:
            out.append((start, min(start + self.max_window, end)))
            start = out[-1][1]
        return out


@dataclass
class SacctSource(JobWindows):
    """Reads finished and running jobs from sacct; see the module docstring for the choices.

    The committed watermark comes from the caller (`run(now, watermark=...)`, as the collector
    service does), else from `watermark_of(name)` (e.g. StoreWriter.watermark), else from memory:
    the end of each batch its consumer came back after.

    `format = "json"`: runs `sacct --json` (Slurm 21.08+) instead of the delimited text and reads
    it with the slurmrestd parser (gpufleet.collector.sources.slurm_json): the same job rows.
    """

    cluster: str = "default"
    command: Sequence[str] = ("sacct",)  # the binary, or a wrapper: ("ssh", "login1", "sacct")
    extra_args: Sequence[str] = ()  # e.g. ("--clusters=gpu",) or ("--partition=gpu",)
    env: Mapping[str, str] = field(default_factory=dict)  # e.g. {"SLURM_CONF": "/etc/slurm/slurm.conf"}
    timeout: float = 300.0
    tz: str = "UTC"  # the zone sacct's times are in (the TZ it is run with)
    overlap: timedelta = timedelta(hours=1)
    initial_lookback: timedelta = timedelta(days=7)
    max_window: timedelta = timedelta(days=1)
    fields: Sequence[str] = DEFAULT_FIELDS
    delimiter: str = UNIT_SEPARATOR
    watermark_of: Callable[[str], str | None] | None = None
    name: str = "sacct"
    format: str = "text"  # or "json": sacct --json
    tracks_gpus: bool | None = None  # whether slurmdbd records gres/gpu (None: not shown yet)
    _remembered: str | None = field(default=None, init=False, repr=False)

    @property
    def watermark_name(self) -> str:
        return f"sacct:{self.cluster}"

    @classmethod
    def from_options(cls, cluster: str, opts: Mapping[str, Any]) -> "SacctSource":
        """From the validated [collector.sacct] table (collector/config.py)."""
        return cls(
            cluster=cluster,
            command=tuple(shlex.split(opts.get("command") or "sacct")),  # a wrapper may take arguments
            env={"SLURM_CONF": opts["slurm_conf"]} if opts.get("slurm_conf") else {},
            timeout=float(opts.get("timeout", cls.timeout)),
            tz=opts.get("timezone") or "UTC",
            overlap=timedelta(seconds=opts.get("overlap_seconds", cls.overlap.total_seconds())),
            initial_lookback=timedelta(seconds=opts.get("initial_lookback_seconds", cls.initial_lookback.total_seconds())),
            format=opts.get("format") or "text",
        )

    def read_window(self, start: datetime, end: datetime, now: datetime | None = None) -> Batch:
        """The jobs sacct lists for [start, end]. No watermark: a backfill of the past must not
        move the live watermark back (run() sets it on its own batches)."""
        text = self.sacct(start, end)
        now = now or utcnow()
        key = f"sacct:{self.cluster}:{start.isoformat()}:{end.isoformat()}"
        if self.format == "json":
            batch = jobs_batch(text, key=key, input=f"{self.command[0]} --json ({start.isoformat()} .. {end.isoformat()} UTC)", cluster=self.cluster, now=now,
                               source="sacct", tracks_gpus=self.tracks_gpus)
        else:
            jobs, rejected, problems = parse_sacct(
                text, fields=self.fields, delimiter=self.delimiter, cluster=self.cluster, now=now, tz=self.tz,
                tracks_gpus=self.tracks_gpus,
            )
            latest, attempts = split_attempts(jobs)
            batch = Batch(key=key, jobs=latest, attempts=attempts, rejected=rejected, problems=problems[:MAX_PROBLEMS_PER_BATCH])
        self.tracks_gpus = note_gpu_tracking(batch, self.command[0], self.tracks_gpus)
        return batch

    def argv(self, start: datetime, end: datetime) -> list[str]:
        window = [f"--starttime={self._local(start)}", f"--endtime={self._local(end)}", f"--state={','.join(WINDOW_STATES)}"]
        if self.format == "json":  # --json ignores --format and the delimiters; steps come inside each job
            return [*self.command, "--allusers", "--duplicates", "--json", *window, *self.extra_args]
        return [
            *self.command, "--allusers", "--allocations", "--duplicates", "--parsable2", "--noheader",
            f"--delimiter={self.delimiter}", f"--format={','.join(self.fields)}", *window, *self.extra_args,
        ]

    def _local(self, t: datetime) -> str:
        return t.replace(tzinfo=timezone.utc).astimezone(as_tz(self.tz)).strftime("%Y-%m-%dT%H:%M:%S")

    def sacct(self, start: datetime, end: datetime) -> str:
        """Run sacct for [start, end] (naive UTC); its stdout, or SourceError saying why not."""
        argv = self.argv(start, end)
        env = {**os.environ, "TZ": self.tz, "SLURM_TIME_FORMAT": "standard", **self.env}
        what = f"{argv[0]} (window {start.isoformat()} .. {end.isoformat()} UTC)"
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True,  # our own process group: a timeout kills it whole
            )
        except FileNotFoundError:
            raise SourceError(f"sacct: {argv[0]!r} not found: install the Slurm client or set the sacct command") from None
        except OSError as e:
            raise SourceError(f"sacct: cannot run {argv[0]!r}: {e}") from None
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SourceError(f"sacct: {what} did not finish in {self.timeout:g}s; killed it") from None
        if proc.returncode != 0:
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
            raise SourceError(f"sacct: {what} {how}: {_tail(err) or '(no stderr)'}")
        return out.decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a grandchild left our group and holds the pipes: give up on them
        pass


def _tail(stderr: bytes, lines: int = 5, chars: int = 600) -> str:
    text = stderr.decode("utf-8", "replace").strip()
    return " | ".join(text.splitlines()[-lines:])[-chars:]
