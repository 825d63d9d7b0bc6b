"""Slurm job mapping from dcgm-exporter's HPC job-mapping directory.

The shipped prolog writes one file per GPU, named by NVML index (`<index>`, or
`<index>.<GPU_I_ID>` for a MIG instance), holding one job id per line; the epilog removes the
job's lines. dcgm-exporter reads the same directory (`--hpc-job-mapping-dir`), so one prolog
serves both exporters. Some site prologs write `0` for "no job"; that line means idle.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from gpufleet.exporter.jobmap.base import JobBinding, MappingError
from gpufleet.exporter.model import GpuIdentity, GpuProcess

_NAME = re.compile(r"^(\d+)(?:\.(\d+))?$")
_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")  # 123, 123_4 (array task), 123+0 (het)


class SlurmMappingDirSource:
    name = "slurm_jobmap"

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._problems: list[str] = []

    @property
    def problems(self) -> list[str]:
        return self._problems

    def collect(
        self,
        gpus: Sequence[GpuIdentity],
        processes: Mapping[int, Sequence[GpuProcess]],
    ) -> list[JobBinding]:
        self._problems = []
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            raise MappingError(
                f"job mapping directory {self.directory} does not exist: expected the directory the "
                "Slurm prolog writes (compose/node/slurm/prolog.sh), or no --job-map-dir"
            ) from None
        except OSError as e:
            raise MappingError(f"job mapping directory {self.directory} is unreadable: {e}") from None
        bindings: list[JobBinding] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue  # the prolog's temporary files
            m = _NAME.match(entry.name)
            if not m or not entry.is_file():
                self._problems.append(f"{entry.path}: name is not <gpu index> or <gpu index>.<GPU_I_ID>")
                continue
            index, gi = int(m.group(1)), (int(m.group(2)) if m.group(2) else None)
            try:
                text = Path(entry.path).read_text(errors="replace")
            except OSError as e:
                self._problems.append(f"{entry.path}: unreadable: {e}")
                continue
            for lineno, line in enumerate(text.splitlines(), 1):
                job = line.strip()
                if not job or job == "0":
                    continue
                if not _JOB_ID.match(job):
                    self._problems.append(f"{entry.path}:{lineno}: {job[:60]!r} is not a Slurm job id")
                    continue
                bindings.append(
                    JobBinding(scheduler="slurm", source=self.name, job_id=job, gpu_index=index, gpu_instance_id=gi)
                )
        return bindings
