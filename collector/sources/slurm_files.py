"""SlurmJsonFilesSource: Slurm job listings in JSON files (`sacct --json > file`, a saved
slurmrestd answer), for sites that have JSON but no REST daemon the collector may reach.

Each run reads every file the globs match. A file's batch key is its path and content hash, so an
unchanged file is read again at no cost (the jobs upsert to the same rows) and a rewritten one is
read anew. A file that is not JSON or has no `jobs` list is reported as unrecognized input (named,
counted, on the Health page); the other files are still read.
"""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator

from gpufleet.collector.schema import Batch
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm_json import jobs_batch, note_gpu_tracking


@dataclass
class SlurmJsonFilesSource:
    cluster: str
    files: list[str] = field(default_factory=list)  # paths or glob patterns
    name: str = "slurm_json"
    tracks_gpus: bool | None = None  # whether the files' slurmdbd records gres/gpu (None: not shown yet)

    def paths(self) -> list[Path]:
        seen: dict[str, Path] = {}
        for pattern in self.files:
            for p in sorted(glob.glob(pattern)):
                seen.setdefault(p, Path(p))
        return list(seen.values())

    def run(self, now: datetime) -> Iterator[Batch]:
        paths = self.paths()
        if not paths:
            raise SourceError(f"slurm_json: no file matches {self.files}")
        failed: list[SourceError] = []
        for path in paths:
            try:
                data = path.read_bytes()
            except OSError as e:
                failed.append(SourceError(f"slurm_json: cannot read {path}: {e.strerror or e}"))
                continue
            digest = hashlib.sha256(data).hexdigest()[:16]
            try:
                batch = jobs_batch(data, key=f"slurm_json:{self.cluster}:{path}:{digest}", input=str(path),
                                   cluster=self.cluster, now=now, source="slurm_json", tracks_gpus=self.tracks_gpus)
            except SourceError as e:
                failed.append(e)
                continue
            self.tracks_gpus = note_gpu_tracking(batch, str(path), self.tracks_gpus)
            yield batch
        if failed:  # after the good files were handed over: they are kept
            raise SourceError("; ".join(str(e) for e in failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else ""),
                              [u for e in failed for u in e.unrecognized])
