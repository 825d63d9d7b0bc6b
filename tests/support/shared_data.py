"""../shared/data: other projects' real outputs (dcgm-exporter dumps, sacct and slurmrestd answers,
nvidia_gpu_exporter scrapes, the real H100's NVML capture) that the tests read.

It lives beside the repository, not in it, so a clone elsewhere has none. A test that reads it then
skips with one line saying so (conftest turns the FileNotFoundError of a path under it into that),
and under CI=true fails instead: CI always has it. Data the project makes itself stays in tests/data/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.realstack.policy import unavailable

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ABSENT_REASON = (f"../shared/data is absent (looked for {SHARED_DATA}): this test reads other projects' "
                 "real outputs from it; run the tests from a checkout beside shared/")


def require_shared_data() -> None:
    """For a test that checks what SHARED_DATA holds without opening a file of it."""
    if not SHARED_DATA.is_dir():
        unavailable(ABSENT_REASON)


def shared_glob(subdir: str, pattern: str) -> list[Path]:
    """The files of SHARED_DATA/subdir matching pattern, sorted, for parametrize. Without the
    folder: one path that does not exist, so the test is collected and skips (or fails under CI)
    when it opens it, rather than vanishing as an empty parameter set."""
    if not SHARED_DATA.is_dir():
        return [SHARED_DATA / subdir / "absent"]
    return sorted((SHARED_DATA / subdir).glob(pattern))


def shared_json_params(relpath: str, arity: int) -> list:
    """The parameter sets a JSON file of SHARED_DATA holds, for parametrize. Without the folder: one
    set of `arity` Nones marked shared_data_absent, which conftest turns into the skip (or the CI
    failure) before the test runs."""
    if not SHARED_DATA.is_dir():
        return [pytest.param(*([None] * arity), marks=pytest.mark.shared_data_absent, id="shared-data-absent")]
    return json.loads((SHARED_DATA / relpath).read_text())


def is_absent_shared_file(error: BaseException) -> bool:
    """True when error is a missing file under SHARED_DATA and the folder itself is missing."""
    if SHARED_DATA.is_dir() or not isinstance(error, FileNotFoundError):
        return False
    name = getattr(error, "filename", None) or ""
    return str(name).startswith(str(SHARED_DATA)) or str(SHARED_DATA) in str(error)


@contextmanager
def absent_shared_data_is_unavailable() -> Iterator[None]:
    """Around a test or fixture: a missing file of an absent SHARED_DATA becomes a skip naming the
    folder (a failure under CI=true); every other error passes through."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised unless it is the absent folder
        if is_absent_shared_file(error):
            unavailable(ABSENT_REASON)
        raise
