"""The product's version, said once: pyproject.toml's, read from the installed package's metadata."""

from __future__ import annotations

from functools import cache
from importlib import metadata

DISTRIBUTION = "gpufleet"


@cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
