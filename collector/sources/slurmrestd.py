"""SlurmrestdSource: Slurm jobs from slurmrestd's REST API, for sites where the collector cannot
run `sacct` (it runs far from the controller, or shelling out is not allowed).

- Auth: a JWT (`scontrol token`, or a site's issuer) sent as X-SLURM-USER-TOKEN, with
  X-SLURM-USER-NAME when `user` is set. The token is read from `token_file` (re-read every run:
  tokens expire and are rotated) or from the environment variable `token_env`. With neither, no
  auth header is sent (slurmrestd behind rest_auth/local on a unix socket, or a proxy that
  authenticates).
- Version: data_parser v0.0.37 (Slurm 21.08) to v0.0.44 (Slurm 25.11). `api_version = "auto"`
  reads slurmrestd's OpenAPI document (`/openapi/v3`, else `/openapi`) and takes the newest
  version that has both job lists; when slurmrestd serves no document it tries the versions
  newest first. Found once per source and kept.
- What: slurmdbd's jobs of each window (`/slurmdb/vX/jobs?start_time=&end_time=`, what sacct
  reads; Unix times from v0.0.39, while v0.0.37/38 take only local times, which slurmrestd reads
  in its own zone: set `timezone` to it, as for sacct), then slurmctld's current jobs (`/slurm/vX/jobs`: running, pending and recently ended, with
  GPUs from `gres_detail`/`tres_per_*` where accounting has no gres/gpu TRES: whether it has is
  asked of `/slurmdb/vX/tres` once). Windows, overlap and
  watermark as the sacct source (gpufleet.collector.sources.slurm.JobWindows); each window is a
  batch of its own, so the windows read before a failure are kept.
- Every record of a window's jobs: a requeued job's earlier attempts are records of their own
  (slurm_parse.split_attempts keeps the latest as the job, the rest as its attempts). slurmdbd
  lists them when the query sets no flag (v0.0.37-v0.0.39 have no parameter for it; v0.0.40+
  default to show_duplicates and disable_truncate_usage_time only while no flag is given), so
  from v0.0.40 both are asked for by name (DUPLICATES_QUERY): with one flag set and not the other,
  slurmdbd would cut the records' times to the window.
- `state=<every base state>` (WINDOW_STATES), as the sacct source asks: without a state slurmdbd
  selects only the jobs with an eligible time in the window, and a job that starts the instant it
  is submitted can have none (Eligible=Unknown). With the states named it selects each by its own
  times (a job that ran in the window by start and end, one that ended in it by end).
- Failures (refused, 401/403, 5xx, timeout, not JSON, no `jobs` list) are SourceErrors that name
  the URL and what came back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

import httpx

from gpufleet.collector.schema import Batch, Unrecognized
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm import BASE_JOB_STATES, JobWindows
from gpufleet.collector.sources.slurm_json import error_text, jobs_batch, note_gpu_tracking, tres_tracks_gpus
from gpufleet.collector.sources.slurm_parse import as_tz
from gpufleet.times import utcnow

# data_parser versions this reads, newest first (slurm_json handles each one's shapes)
VERSIONS = ("v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38", "v0.0.37")
OPENAPI_PATHS = ("/openapi/v3", "/openapi")
# The states a window asks for by name, as sacct's (slurm.WINDOW_STATES) but the base states only:
# 22.05's dbv0.0.38 reads REQUEUED, RESIZING and REVOKED as PENDING, and a name it already has,
# last in the list, fails the whole query ("Unable to parse CSV list"), seen on the real
# slurmrestd; REQUEUED records are listed with these (tests/test_slurmrestd_real.py).
WINDOW_STATES = BASE_JOB_STATES
# v0.0.40+: every record of a requeued job, with its own start and end (see the module docstring)
DUPLICATES_QUERY = {"show_duplicates": "true", "disable_truncate_usage_time": "true"}
_JOBS_PATH = re.compile(r"^/(slurm|slurmdb)/(v0\.0\.\d+)/jobs/?$")


def _epoch(t: datetime) -> int:
    return int(t.replace(tzinfo=timezone.utc).timestamp())


@dataclass
class SlurmrestdSource(JobWindows):
    url: str
    cluster: str = "default"
    token_file: str = ""
    token_env: str = ""
    user: str = ""
    api_version: str = "auto"
    verify_tls: bool = True
    timeout: float = 60.0
    tz: str = "UTC"  # slurmrestd's time zone: v0.0.37/38 read start_time/end_time in it
    overlap: timedelta = timedelta(hours=1)
    initial_lookback: timedelta = timedelta(days=7)
    max_window: timedelta = timedelta(days=1)
    current_jobs: bool = True  # also read slurmctld's running, pending and recently ended jobs
    tracks_gpus: bool | None = None  # whether slurmdbd records gres/gpu: asked of /slurmdb/vX/tres, else from the records
    transport: httpx.BaseTransport | None = None  # e.g. httpx.HTTPTransport(uds=...) for a unix socket
    watermark_of: Callable[[str], str | None] | None = None
    name: str = "slurmrestd"
    _remembered: str | None = field(default=None, init=False, repr=False)
    _version: str | None = field(default=None, init=False, repr=False)

    @property
    def watermark_name(self) -> str:
        return f"slurmrestd:{self.cluster}"

    @classmethod
    def from_options(cls, cluster: str, opts: Mapping[str, Any]) -> "SlurmrestdSource":
        """From the validated [collector.slurmrestd] table (collector/config.py)."""
        transport = None
        url = opts["url"]
        if url.startswith("unix:"):  # unix:/run/slurmrestd.sock
            transport, url = httpx.HTTPTransport(uds=url.removeprefix("unix:")), "http://slurmrestd"
        return cls(
            url=url, cluster=cluster, token_file=opts.get("token_file", ""), token_env=opts.get("token_env", ""),
            user=opts.get("user", ""), api_version=opts.get("api_version", "auto"), verify_tls=opts.get("verify_tls", True),
            timeout=float(opts.get("timeout", cls.timeout)), transport=transport, tz=opts.get("timezone") or "UTC",
            overlap=timedelta(seconds=opts.get("overlap_seconds", cls.overlap.total_seconds())),
            initial_lookback=timedelta(seconds=opts.get("initial_lookback_seconds", cls.initial_lookback.total_seconds())),
        )

    # --- runs ---

    def after_windows(self, now: datetime) -> list[Batch]:
        return [self.read_current(now)] if self.current_jobs else []

    def read_window(self, start: datetime, end: datetime, now: datetime | None = None) -> Batch:
        """slurmdbd's jobs for [start, end] (no watermark: run() sets it on its own batches)."""
        now = now or utcnow()
        version = self.version()
        path = f"/slurmdb/{version}/jobs"
        text = self._get(path, self.window_query(version, start, end))
        def read(tracks: bool | None) -> Batch:
            return jobs_batch(text, key=f"slurmrestd:{self.cluster}:{start.isoformat()}:{end.isoformat()}",
                              input=self.url.rstrip("/") + path, cluster=self.cluster, now=now, tracks_gpus=tracks)
        batch = read(self.tracks_gpus)
        if self.tracks_gpus is None and any(j["gpus"] is None and j["alloc_tres"] for j in batch.jobs):
            # no record showed whether slurmdbd tracks GPUs, and some name none: ask it
            self.tracks_gpus = self.ask_tracks_gpus()
            if self.tracks_gpus:
                batch = read(True)
        self.tracks_gpus = note_gpu_tracking(batch, self.url.rstrip("/") + path, self.tracks_gpus)
        return batch

    def window_query(self, version: str, start: datetime, end: datetime) -> dict[str, str]:
        """The query of slurmdbd's jobs of [start, end]: every record of each job that ran, ended
        or was pending in it (see the module docstring)."""
        query = {"start_time": self._time(version, start), "end_time": self._time(version, end), "state": ",".join(WINDOW_STATES)}
        return {**query, **DUPLICATES_QUERY} if version >= "v0.0.40" else query

    def ask_tracks_gpus(self) -> bool | None:
        """Whether slurmdbd accounts gres/gpu, from /slurmdb/vX/tres; None when it does not say
        (the records tell then: slurm_json.note_gpu_tracking)."""
        path = f"/slurmdb/{self.version()}/tres"
        try:
            r = self._request(path, {})
        except SourceError:
            return None
        return tres_tracks_gpus(r.text) if r.status_code == 200 else None

    def read_current(self, now: datetime) -> Batch:
        """slurmctld's jobs now: pending and running ones, and the ended ones it still keeps
        (MinJobAge): their GPUs are what accounting may lack (the store keeps the most
        authoritative count it read, collector.store JOB_MERGE)."""
        path = f"/slurm/{self.version()}/jobs"
        return jobs_batch(self._get(path, {}), key=f"slurmrestd:{self.cluster}:current:{now.isoformat()}",
                          input=self.url.rstrip("/") + path, cluster=self.cluster, now=now)

    def _time(self, version: str, t: datetime) -> str:
        """A window edge as `version` reads it: Unix time, or before v0.0.39 local ISO time."""
        if version >= "v0.0.39":
            return str(_epoch(t))
        return t.replace(tzinfo=timezone.utc).astimezone(as_tz(self.tz)).strftime("%Y-%m-%dT%H:%M:%S")

    # --- the API version ---

    def version(self) -> str:
        if self._version is None:
            self._version = self.api_version if self.api_version != "auto" else self._discover()
        return self._version

    def _discover(self) -> str:
        """The newest data_parser version slurmrestd serves both job lists for."""
        for path in OPENAPI_PATHS:
            r = self._request(path, {})
            if r.status_code == 404:
                continue
            self._check(r, path)
            try:
                paths = r.json().get("paths") or {}
            except (ValueError, AttributeError):
                raise SourceError(f"slurmrestd {self.url}{path}: not an OpenAPI document: {r.text[:200]!r}",
                                  [Unrecognized(self.url + path, "unknown_answer", f"not an OpenAPI document: {r.text[:120]!r}")]) from None
            found: dict[str, set[str]] = {}
            for p in paths:
                m = _JOBS_PATH.match(p)
                if m:
                    found.setdefault(m[2], set()).add(m[1])
            usable = [v for v in VERSIONS if found.get(v, set()) >= {"slurm", "slurmdb"}]
            if usable:
                return usable[0]
            served = sorted(found) or sorted({p.split("/")[2] for p in paths if p.count("/") > 2})[:8]
            raise SourceError(f"slurmrestd {self.url}: no job lists of a supported data_parser version "
                              f"({VERSIONS[-1]}..{VERSIONS[0]}) in {path}; it serves {served or 'none'} "
                              "(load the openapi/slurmdbd and openapi/slurmctld plugins, or set api_version)",
                              [Unrecognized(self.url + path, "unsupported_version", f"versions served: {served}")])
        for v in VERSIONS:  # no OpenAPI document: try newest first
            r = self._request(f"/slurmdb/{v}/jobs", {"start_time": str(_epoch(utcnow()))})
            if r.status_code != 404:
                self._check(r, f"/slurmdb/{v}/jobs")
                return v
        raise SourceError(f"slurmrestd {self.url}: no /openapi document and no /slurmdb/vX/jobs for any of {', '.join(VERSIONS)}")

    # --- HTTP ---

    def headers(self) -> dict[str, str]:
        token = ""
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as e:
                raise SourceError(f"slurmrestd: cannot read token_file {self.token_file}: {e.strerror or e}") from None
            token = token.removeprefix("SLURM_JWT=")  # the line `scontrol token` prints
            if not token:
                raise SourceError(f"slurmrestd: token_file {self.token_file} is empty")
        elif self.token_env:
            token = os.environ.get(self.token_env, "").strip().removeprefix("SLURM_JWT=")
            if not token:
                raise SourceError(f"slurmrestd: environment variable {self.token_env} (token_env) is not set or empty")
        out = {"Accept": "application/json"}
        if token:
            out["X-SLURM-USER-TOKEN"] = token
        if self.user:
            out["X-SLURM-USER-NAME"] = self.user
        return out

    def _request(self, path: str, params: dict[str, str]) -> httpx.Response:
        url = self.url.rstrip("/") + path
        try:
            with httpx.Client(timeout=self.timeout, verify=self.verify_tls, transport=self.transport) as client:
                return client.get(url, params=params, headers=self.headers())
        except httpx.TimeoutException:
            raise SourceError(f"slurmrestd {url}: no answer in {self.timeout:g} s (timeout)") from None
        except httpx.HTTPError as e:
            raise SourceError(f"slurmrestd {url} unreachable: {type(e).__name__}: {e}") from None

    def _check(self, r: httpx.Response, path: str) -> None:
        url = self.url.rstrip("/") + path
        if r.status_code in (401, 403):
            how = "token_file" if self.token_file else (f"token_env {self.token_env}" if self.token_env else "no token configured")
            raise SourceError(f"slurmrestd {url}: HTTP {r.status_code} {r.reason_phrase}: authentication refused "
                              f"(JWT from {how}; expired, or AuthAltTypes=auth/jwt missing?): {_errors(r)}")
        if r.status_code != 200:
            raise SourceError(f"slurmrestd {url}: HTTP {r.status_code} {r.reason_phrase}: {_errors(r)}")

    def _get(self, path: str, params: dict[str, str]) -> str:
        r = self._request(path, params)
        self._check(r, path)
        return r.text


def _errors(r: httpx.Response) -> str:
    """Slurm's own `errors` of an answer when it has them (its meta block is long), else the text."""
    try:
        errors = r.json().get("errors")
    except (ValueError, AttributeError):
        errors = None
    if isinstance(errors, list) and errors:
        return "; ".join(error_text(e) for e in errors[:3])
    return r.text[:300]
