"""Scrape targets directly: dcgm-exporter (any version) and gpufleet exporters, in one schema.

Targets come from a static list and Prometheus `file_sd`-style files (JSON or YAML lists of
`{targets: [...], labels: {...}}`, re-read every round, so the same files can drive Prometheus
and the collector). A round scrapes all targets concurrently with a timeout each; a target that
is down or returns garbage is reported and the others are stored. One round is one batch.
"""

from __future__ import annotations

import glob
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import httpx

from gpufleet.collector.exposition_parse import ScrapeRows, merge_exporters, parse_rows, samples_table
from gpufleet.collector.schema import SAMPLE_SCHEMA, empty_table
from gpufleet.collector.schema import Batch, Unrecognized
from gpufleet.collector.sources.base import SourceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    address: str  # host:port or a full URL
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        return self.address if "://" in self.address else f"http://{self.address}/metrics"


@dataclass
class TargetStatus:
    up: bool = False
    duration_seconds: float = 0.0
    error: str = ""
    samples: int = 0  # GPU rows parsed from the last answer
    rejected: int = 0  # malformed lines in the last answer


@dataclass
class ScrapeSource:
    cluster: str
    static_targets: list[str] = field(default_factory=list)
    file_sd: list[str] = field(default_factory=list)
    timeout: float = 10.0
    max_workers: int = 16
    shard: Any = None  # gpufleet.collector.shard.Shard: scrape only the targets whose host hashes to it
    name: str = "scrape"
    status: dict[str, TargetStatus] = field(default_factory=dict)  # the current targets' last round
    rejected_total: dict[str, int] = field(default_factory=dict)  # malformed lines per target, ever
    targets_total: int = 0  # targets listed in the last round, all shards

    def targets(self) -> tuple[list[Target], list[str]]:
        """The current target list, and problems with the file_sd files (those files are skipped)."""
        out = [Target(t) for t in self.static_targets]
        problems = []
        for pattern in self.file_sd:
            for path in sorted(glob.glob(pattern)) or []:
                try:
                    out.extend(_read_file_sd(Path(path)))
                except (OSError, ValueError, TypeError) as e:
                    problems.append(f"file_sd {path}: {e}")
        seen, unique = set(), []
        for t in out:
            if t.address not in seen:
                seen.add(t.address)
                unique.append(t)
        self.targets_total = len(unique)
        if self.shard is not None:
            unique = [t for t in unique if self.shard.owns(t.address)]
        return unique, problems

    def run(self, now: datetime) -> Iterable[Batch]:
        targets, problems = self.targets()
        if not targets and self.shard is not None and self.targets_total:
            raise SourceError(f"none of the {self.targets_total} scrape targets falls to shard {self.shard.index}/{self.shard.count}: "
                              "fewer nodes than shards?")
        if not targets:
            raise SourceError("no scrape targets: set [collector.scrape] targets or file_sd")
        with httpx.Client(timeout=self.timeout, headers={"Accept-Encoding": "gzip"}) as client:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(targets))) as pool:
                results = list(pool.map(lambda t: self._scrape(client, t), targets))
        yield self.round_batch(now, [(t, status, body) for t, (status, body) in zip(targets, results)], problems)

    def round_batch(self, now: datetime, answers: list[tuple[Target, TargetStatus, str | None]], problems: list[str] | None = None) -> Batch:
        """One round's answers (target, its status, the body or None) -> the round's batch (one
        samples table for all targets: cheaper to build, and to commit, than one per target)."""
        problems = list(problems or [])
        parts, gpus, allocations, throughput, checkpoints, shares, rejected, unrecognized = [], [], [], [], [], [], 0, []
        self.status = {target.address: status for target, status, _ in answers}  # targets dropped from file_sd go
        for target, status, body in answers:
            if body is None:
                problems.append(f"{target.address}: {status.error}")
                continue
            parsed = parse_rows(body, ts=now, cluster=self.cluster, target=target.address, target_labels=dict(target.labels))
            status.samples = parsed.num_rows
            status.rejected = parsed.rejected
            self.rejected_total[target.address] = self.rejected_total.get(target.address, 0) + parsed.rejected
            parts.append(parsed)
            gpus += parsed.gpus
            allocations += parsed.allocations
            throughput += parsed.throughput
            checkpoints += parsed.checkpoints
            shares += parsed.shares
            rejected += parsed.rejected
            problems += [f"{target.address}: {p}" for p in parsed.problems[:5]]
            unrecognized += [Unrecognized(target.address, kind, text) for kind, text in parsed.warnings]
            if not parsed.num_rows:
                unrecognized.append(Unrecognized(target.address, "no_gpu_rows", no_gpu_rows(body, parsed)))
        if not any(status.up for _, status, _ in answers):
            raise SourceError(f"all {len(answers)} scrape targets failed; first: {problems[0] if problems else '?'}")
        # a GPU both dcgm-exporter and the gpufleet exporter report: one row (PRECEDENCE)
        samples = samples_table(merge_exporters(parts)) if parts else empty_table(SAMPLE_SCHEMA)
        return Batch(
            key=f"scrape:{self.cluster}:{now.isoformat()}",
            samples=samples,
            gpus=gpus,
            allocations=allocations,
            throughput=throughput,
            checkpoints=checkpoints,
            shares=shares,
            rejected=rejected,
            problems=problems,
            unrecognized=unrecognized,
        )

    def _scrape(self, client: httpx.Client, target: Target) -> tuple[TargetStatus, str | None]:
        status = TargetStatus()
        try:
            r = client.get(target.url)
            status.duration_seconds = r.elapsed.total_seconds()
            if r.status_code != 200:
                status.error = f"HTTP {r.status_code} from {target.url}"
                return status, None
            status.up = True
            return status, r.text
        except httpx.HTTPError as e:
            status.error = f"{type(e).__name__} scraping {target.url}: {e}"
            return status, None


def no_gpu_rows(body: str, parsed: ScrapeRows) -> str:
    """What a body that gave no GPU rows held instead, for the unrecognized-input report."""
    what = f"{len(body)} bytes, no GPU series this collector reads"
    if parsed.rejected:
        what += f", {parsed.rejected} malformed lines"
    if parsed.unknown_names:
        what += "; metric families there: " + ", ".join(parsed.unknown_names)
    elif not body.strip():
        what += " (empty body)"
    return what


def _read_file_sd(path: Path) -> list[Target]:
    text = path.read_text()
    if path.suffix in (".yml", ".yaml"):
        import yaml

        doc = yaml.safe_load(text)
    else:
        doc = json.loads(text)
    if not isinstance(doc, list):
        raise ValueError("expected a list of {targets: [...], labels: {...}} groups")
    out = []
    for i, group in enumerate(doc):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ValueError(f"group {i}: expected {{targets: [...], labels: {{...}}}}")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError(f"group {i}: labels must be a mapping")
        for t in group["targets"]:
            out.append(Target(str(t), tuple(sorted((str(k), str(v)) for k, v in labels.items()))))
    return out
