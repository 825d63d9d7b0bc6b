"""A GPU's sample intervals cut into bucket pieces, and the pieces cut again at allocation edges:
what the store's facts (gpufleet.collector.facts) are built from."""

from __future__ import annotations

import numpy as np


def distinct(x: np.ndarray) -> np.ndarray:
    """x's distinct values, ascending: np.unique's result by a sort. (numpy 2.3's np.unique hashes
    integers and then sorts the distinct values: 20-60x slower than a sort on int64 arrays of 10^4
    to 10^6 values - 2 s of a 16,384-GPU week's queue gaps.)"""
    s = np.sort(x, axis=None)
    keep = np.empty(len(s), dtype=bool)
    keep[:1] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def positions_within(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[i] - 1 for each i in turn: each element's place in its run, where
    np.repeat(x, counts) made the runs (a piece per bucket, per cut, per hold of a GPU)."""
    return np.arange(int(np.sum(counts))) - np.repeat(np.cumsum(counts) - counts, counts)


def intervals(g: np.ndarray, ts: np.ndarray, gap_us: int) -> np.ndarray:
    """End of each sample's interval (samples ordered by GPU g, then time ts in us): the next
    sample of the same GPU, at most gap_us later. Duplicate times give zero-length intervals."""
    t1 = ts + gap_us
    if len(ts) > 1:
        same = g[1:] == g[:-1]
        t1[:-1] = np.where(same, np.minimum(t1[:-1], ts[1:]), t1[:-1])
    return t1


def split(t0: np.ndarray, t1: np.ndarray, lo: np.ndarray | int, hi: np.ndarray | int, bucket_us: int) -> tuple[np.ndarray, ...]:
    """The intervals [t0, t1) clipped to [lo, hi) and cut at bucket edges (multiples of bucket_us
    since the epoch): (index of the interval, bucket k, p0, p1) for each piece of positive length,
    in the intervals' order."""
    a = np.maximum(t0, lo)
    b = np.minimum(t1, hi)
    idx = np.flatnonzero(b > a)
    a, b = a[idx], b[idx]
    k0, k1 = a // bucket_us, (b - 1) // bucket_us
    cnt = k1 - k0 + 1
    if len(cnt) and cnt.max() > 1:
        rep = np.repeat(np.arange(len(a)), cnt)
        k = np.repeat(k0, cnt) + positions_within(cnt)
        p0 = np.maximum(a[rep], k * bucket_us)
        p1 = np.minimum(b[rep], (k + 1) * bucket_us)
        return idx[rep], k, p0, p1
    return idx, k0, a, b


# segment keys: GPU << KEY_SHIFT | (time - the read window's start), the window under 2^34 us (4.7 h)
KEY_SHIFT = 34


def segments(g: np.ndarray, k: np.ndarray, p0: np.ndarray, p1: np.ndarray, cut_g: np.ndarray, cut_t: np.ndarray,
             base: int, bucket_us: int) -> tuple[np.ndarray, ...]:
    """Bucket pieces (GPU g, bucket k, [p0, p1), in order) cut again at their GPU's cut times:
    (index of the piece, p0, p1, s0, s1) with [s0, s1) the segment each lies in - its bucket
    between the cuts either side. Cut times must lie in [base, base + 2^KEY_SHIFT)."""
    b0 = k * bucket_us
    idx = np.arange(len(p0))
    if not len(cut_t):
        return idx, p0, p1, b0, b0 + bucket_us
    cuts = distinct((cut_g.astype(np.int64) << KEY_SHIFT) | (cut_t - base))
    own = g << KEY_SHIFT
    lo = np.searchsorted(cuts, own | (p0 - base), side="right")
    n = np.searchsorted(cuts, own | (p1 - base), side="left") - lo  # cuts strictly inside a piece
    if n.max(initial=0) > 0:
        idx = np.repeat(idx, n + 1)
        j = positions_within(n + 1)  # 0 .. n within a piece
        at = lo[idx] + j
        inner = (cuts[np.minimum(at, len(cuts) - 1)] & ((1 << KEY_SHIFT) - 1)) + base
        prev = (cuts[np.maximum(at - 1, 0)] & ((1 << KEY_SHIFT) - 1)) + base
        p0 = np.where(j == 0, p0[idx], prev)
        p1 = np.where(j == n[idx], p1[idx], inner)
        g, b0, own = g[idx], b0[idx], own[idx]
    key = own | (p0 - base)
    before = np.searchsorted(cuts, key, side="right") - 1  # the last cut at or before a piece's start
    c = cuts[np.maximum(before, 0)]
    s0 = np.where((before >= 0) & ((c >> KEY_SHIFT) == g), (c & ((1 << KEY_SHIFT) - 1)) + base, b0)
    s0 = np.maximum(s0, b0)
    after = np.minimum(before + 1, len(cuts) - 1)  # the first cut after it
    c = cuts[after]
    s1 = np.where((before + 1 < len(cuts)) & ((c >> KEY_SHIFT) == g), (c & ((1 << KEY_SHIFT) - 1)) + base, b0 + bucket_us)
    s1 = np.minimum(s1, b0 + bucket_us)
    return idx, p0, p1, s0, s1
