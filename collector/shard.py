"""Sharded ingest: N collectors share one store, each scraping its share of the nodes.

`[collector] shard = "K/N"` (or `gpufleet collect --shard K/N`) makes a collector scrape only the
targets whose host hashes to K (of N), and write a store of its own under
`<store>/shards/K-of-N/`. Shards share nothing while they run (no lock, no common file but the
accounting claim), and readers (gpufleet.collector.store.open_reader) see the union of every
shard's manifest, so every GPU is read exactly once.

The hash is of the target's host, not its address: dcgm-exporter and the gpufleet exporter on the
same node must land in the same shard, where the precedence rule merges their rows of one GPU.
It is a stable hash (SHA-256), so adding a target moves no other; changing N moves most.

Scheduler accounting (sacct, slurmrestd, Kubernetes, Slurm JSON files) is read by exactly one
shard, the one with `[collector] accounting = true`: it claims `<store>/shards/accounting` at
start, and a second shard claiming it is refused there.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

SHARDS_DIR = "shards"
ACCOUNTING_CLAIM = "accounting"
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(Exception):
    """A shard setting or claim is wrong; the message says what and what was expected."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, spec: str) -> "Shard":
        m = _SPEC.match(spec or "")
        if not m or not 1 <= int(m[1]) <= int(m[2]):
            raise ShardError(f"shard {spec!r}: expected K/N with 1 <= K <= N, e.g. \"2/4\"")
        return cls(int(m[1]), int(m[2]))

    @property
    def name(self) -> str:
        return f"{self.index}-of-{self.count}"

    def root(self, store: str | Path) -> Path:
        """Where this shard's own store lives inside the shared store directory."""
        return Path(store) / SHARDS_DIR / self.name

    def owns(self, address: str) -> bool:
        return shard_of(address, self.count) == self.index


def target_host(address: str) -> str:
    """The host of a scrape target (host:port or URL), lower-cased: what a shard is chosen by."""
    if "://" in address:
        return (urlsplit(address).hostname or address).lower()
    host = address.rsplit("@", 1)[-1]
    if host.startswith("["):  # [v6]:port
        return host[1:host.find("]")].lower() if "]" in host else host.lower()
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).lower()


def shard_of(address: str, count: int) -> int:
    """The 1-based shard a target belongs to among `count`: a stable hash of its host."""
    digest = hashlib.sha256(target_host(address).encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def claim_accounting(store: str | Path, shard: Shard) -> None:
    """Record that `shard` reads the scheduler accounting of this store; refuse a second claimant.

    The claim is a file created exclusively, so two shards starting at the same time cannot both
    win. The same shard restarting keeps its claim; moving accounting to another shard means
    deleting the file (the message says which).
    """
    path = Path(store) / SHARDS_DIR / ACCOUNTING_CLAIM
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        owner = path.read_text().strip()
        if owner != shard.name:
            raise ShardError(
                f"shard {shard.index}/{shard.count} is set to read the scheduler accounting ([collector] accounting = true), "
                f"but shard {owner or '(unknown)'} owns it ({path}): exactly one shard may; set accounting = false here, "
                f"or stop that shard and delete {path} to move it") from None
        return
    with os.fdopen(fd, "w") as f:
        f.write(shard.name + "\n")
        f.flush()
        os.fsync(f.fileno())
