"""Prometheus text exposition -> samples, line by line, with a fast path and a reference path.

prometheus_client's parser is the reference for what a line means, but it has two problems for
the collector: it stops at the first bad line (losing every good line after it), and it spends
~35 µs per line, far too slow for 1,024 GPUs × ~30 fields per scrape. So each line is parsed
on its own: the common shape `name{k="v",...} value [timestamp]` (and `name value`, HELP/TYPE
comments) by one compiled regex over the whole body plus dict caches (dcgm-exporter repeats each
GPU's label set and many values on every family), anything else by prometheus_client on that one
line. The fast path accepts only lines whose meaning it is sure of, so both paths give identical
samples (tests/test_exposition_parse.py checks this on every fixture and on generated tricky
input); a line prometheus_client rejects is counted and skipped.

Rules on top of prometheus_client: a UTF-8 byte-order mark before the first line is dropped
(files saved by Windows editors); a last line without its terminating newline is read, as
Prometheus reads it, but noted in `Scan.notes` (a body cut in the middle of a value would give a
wrong number: HTTP bodies are checked against their length by the client, files are not); and a
line the fast path cannot read that is longer than MAX_LINE_CHARS is rejected unparsed
(prometheus_client's label scanner is quadratic on quote-heavy junk; the fast path is linear and
has no limit).

For speed the scan can also pivot samples straight into the caller's columns (`Pivot`): a
sample then costs a few dict lookups and one store, with no intermediate tuple.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from prometheus_client.parser import text_string_to_metric_families

Value = Union[int, float]
# (line number, metric name, cache key of the label set, labels, value). Samples with the same
# key have equal labels; the fast path also hands out the same dict object for them.
Sample = tuple[int, str, object, dict[str, str], Value]

MAX_LINE_CHARS = 16384
BOM = "\ufeff"  # a UTF-8 byte-order mark, as decoded
MAX_PROBLEMS = 20  # problem strings kept per scrape; `rejected` counts all

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"  # `__` names are reserved: prometheus_client rejects them
_LABEL_VALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'  # "unrolled": runs of plain characters are one fast step
_LABEL = _LABEL_NAME + "=" + _LABEL_VALUE
# Every line of a body: groups 1-3 (name, label block, "value [ts]" after the space) when it has
# the sample shape, else group 4 (the whole line: comments, blanks, anything odd). The shape is
# only a pre-split; the block and value are validated below (cached), the name by its pattern.
# `.` is any character but \n (and faster than [^\n]).
_LINE_RE = re.compile(f"^(?:({_NAME})(?:\\{{(.*)\\}})? (.*)|(.*))$", re.M)
# A whole label block (between the braces): labels separated by a comma and optional blanks
# (dcgm-exporter's README sample has `{gpu="0", UUID=...}`). Unambiguous, so matching is linear.
_BLOCK_RE = re.compile(f"(?:{_LABEL}(?:,[ \\t]*{_LABEL})*)?")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# "value" or "value timestamp"; group 1 set when the value is an integer (parsed with int(), as
# prometheus_client does, so 64-bit counters and DCGM's blank sentinels stay exact).
_NUM = r"(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?"
_VALUE_RE = re.compile(f"(?:([-+]?[0-9]+)|([-+]?{_NUM}|NaN|[-+]?Inf))(?: [-+]?[0-9]+)?")
_COMMENT_RE = re.compile(
    f"# (?:HELP {_NAME}(?: .*)?"
    f"|TYPE {_NAME} (?:counter|gauge|histogram|summary|untyped|unknown|info|stateset|gaugehistogram))"
)

# Label blocks, comment lines and many values repeat from scrape to scrape (a target's label
# sets change only when its jobs or GPUs do; clocks, zeros and totals hardly ever), so what they
# mean is kept across scans, up to this many of each (then forgotten at once and relearned: the
# caches are an optimization only).
MAX_CACHED = 1 << 16
_BLOCK_CACHE: dict[str, Optional[dict[str, str]]] = {}  # label block text -> _parse_block(text)
_GOOD_COMMENTS: set[str] = set()  # comment lines _COMMENT_RE accepts
_VALUE_CACHE: dict[str, Optional[Value]] = {}  # "value [ts]" text -> _parse_value(text)
_UNASKED = object()  # a label block's row before Pivot.row_of is asked

# Pivot.column_of answers, besides (column, scale):
SKIP = None  # the caller has no use for this metric: drop its samples
KEEP: tuple[None, float] = (None, 1.0)  # keep its samples in Scan.samples for the caller
# Pivot.row_of answers, besides a row index >= 0:
DROP_ROW = -1  # drop the sample
KEEP_ROW = -2  # keep it in Scan.samples (e.g. to reject it with its line number)


@dataclass
class Pivot:
    """Where samples go when the caller stores them as columns (dict row -> value) of rows.

    column_of(name) -> (column, scale) | SKIP | KEEP, asked once per metric name;
    row_of(key, labels) -> row index | DROP_ROW | KEEP_ROW, asked once per label set.
    A stored value is `value * scale` (legacy units); later samples of a cell overwrite earlier.
    Its caches are per scan: make a new Pivot for each.
    """

    column_of: Callable[[str], Optional[tuple[Optional[dict[int, Any]], float]]]
    row_of: Callable[[object, dict[str, str]], int]
    targets: dict[str, Any] = field(default_factory=dict)
    rows: dict[object, int] = field(default_factory=dict)

    def route(self, sample: Sample, keep: list[Sample]) -> None:
        """The slow path's way in; the fast path inlines the same steps."""
        _, name, key, labels, value = sample
        target = self.targets.get(name, False)
        if target is False:
            target = self.targets[name] = self.column_of(name)
        if target is SKIP:
            return
        column, scale = target
        if column is None:
            keep.append(sample)
            return
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = self.row_of(key, labels)
        if row >= 0:
            column[row] = value if scale == 1.0 else value * scale
        elif row == KEEP_ROW:
            keep.append(sample)


@dataclass
class Scan:
    samples: list[Sample] = field(default_factory=list)  # all, or with a Pivot the ones it kept
    rejected: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # accepted but worth a warning

    def reject(self, lineno: int, reason: str) -> None:
        self.rejected += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {lineno}: {reason}")


def scan(text: str, *, fast: bool = True, pivot: Pivot | None = None) -> Scan:
    """Every sample of an exposition (or, with a pivot, the ones it keeps); bad lines counted.

    fast=False parses every line with prometheus_client: the reference the fast path must equal.
    """
    out = Scan()
    if text.startswith(BOM):
        text = text[1:]
    if "\r" in text:  # CRLF: prometheus_client strips the \r with the line; drop it up front
        text = text.replace("\r\n", "\n")
    cut = text.rfind("\n") + 1  # lines end at \n only, as prometheus_client reads them
    body, tail = text[:cut], text[cut:]
    if tail.strip():
        out.notes.append(f"line {body.count(chr(10)) + 1}: no newline at end of body, read as Prometheus reads it: {_snippet(tail)}")
        body = text + "\n"
    if pivot is None:
        pivot = Pivot(lambda name: KEEP, lambda key, labels: KEEP_ROW)
    if fast:
        _scan_fast(body, out, pivot)
    else:
        for n, raw in enumerate(body.split("\n")[:-1], 1):
            _scan_reference_line(n, raw, out, pivot)
    return out


def _scan_fast(body: str, out: Scan, pivot: Pivot) -> None:
    keep = out.samples.append
    # label block text -> [labels (None: not fast-path), its row or _UNASKED]: every field of a
    # GPU repeats its block, so one lookup gives both (the block is hashed and compared once)
    blocks: dict[str, list[Any]] = {}
    values = _VALUE_CACHE  # "value [ts]" text -> value (None: not fast-path)
    targets, column_of, row_of = pivot.targets, pivot.column_of, pivot.row_of
    good_comments = _GOOD_COMMENTS
    lines: list[str] | None = None  # the body split into lines, made on the first slow line
    n = 0
    for name, block, rest, other in _LINE_RE.findall(body):
        n += 1
        if name:
            try:
                entry = blocks[block]
            except KeyError:
                entry = blocks[block] = [_labels_of(block), _UNASKED]
            labels = entry[0]
            if labels is not None:
                try:
                    value = values[rest]
                except KeyError:
                    value = _value_of(rest)
                if value is not None:
                    # the sample is good; route it (as Pivot.route does)
                    try:
                        target = targets[name]
                    except KeyError:
                        target = targets[name] = column_of(name)
                    if target is SKIP:
                        continue
                    column, scale = target
                    if column is None:
                        keep((n, name, block, labels, value))
                        continue
                    row = entry[1]
                    if row is _UNASKED:
                        row = entry[1] = row_of(block, labels)
                    if row >= 0:
                        column[row] = value if scale == 1.0 else value * scale
                    elif row == KEEP_ROW:
                        keep((n, name, block, labels, value))
                    continue
        elif not other or other in good_comments or _comment_ok(other):
            continue
        if lines is None:
            lines = body.split("\n")
        _scan_reference_line(n, lines[n - 1], out, pivot)


def _value_of(rest: str) -> Value | None:
    """_parse_value(rest), remembered across scans (many values repeat: clocks, zeros, totals)."""
    if len(_VALUE_CACHE) >= MAX_CACHED:
        _VALUE_CACHE.clear()
    value = _VALUE_CACHE[rest] = _parse_value(rest)
    return value


def _labels_of(block: str) -> dict[str, str] | None:
    """_parse_block(block), from the cross-scan cache when it can (a new dict for each scan)."""
    try:
        labels = _BLOCK_CACHE[block]
    except KeyError:
        labels = _parse_block(block)
        if len(_BLOCK_CACHE) >= MAX_CACHED:
            _BLOCK_CACHE.clear()
        _BLOCK_CACHE[block] = labels
    return None if labels is None else labels.copy()


def _comment_ok(line: str) -> bool:
    """A HELP or TYPE line the fast path may skip (remembered across scans)."""
    if _COMMENT_RE.fullmatch(line) is None:
        return False
    if len(_GOOD_COMMENTS) >= MAX_CACHED:
        _GOOD_COMMENTS.clear()
    _GOOD_COMMENTS.add(line)
    return True


def _parse_block(block: str) -> dict[str, str] | None:
    """Labels of a `k="v",...` block, or None when the fast path cannot be sure of them."""
    if _BLOCK_RE.fullmatch(block) is None:
        return None
    pairs = _PAIR_RE.findall(block)  # the block is valid, so this finds exactly its labels
    if "\\" in block:
        labels = {k: (_ESCAPE_RE.sub(_unescape, v) if "\\" in v else v) for k, v in pairs}
    else:
        labels = dict(pairs)
    if len(labels) != len(pairs):
        return None  # a duplicate label name: the reference rejects the line
    return labels


def _unescape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group(0)]


def _parse_value(rest: str) -> Value | None:
    if rest.isdigit() and rest.isascii() and len(rest) < 19:  # most DCGM values: a plain int, no timestamp
        return int(rest)  # what the regex below gives for it (group 1), at half the cost
    head, dot, tail = rest.partition(".")
    if dot and (head.isdigit() or not head) and (tail.isdigit() or not tail) and (head or tail) and rest.isascii():
        return float(rest)  # a plain decimal like "12.5", ".5" or "5.": the regex's group 2, unchanged
    m = _VALUE_RE.fullmatch(rest)
    if m is None:
        return None
    if m.group(1) is not None:
        try:
            return int(m.group(1))
        except ValueError:  # more digits than int() takes (sys.get_int_max_str_digits)
            return float(m.group(1))
    return float(m.group(2))


def _scan_reference_line(n: int, raw: str, out: Scan, pivot: Pivot) -> None:
    line = raw.strip()
    if not line:
        return
    if len(line) > MAX_LINE_CHARS:
        out.reject(n, f"unreadable line of {len(line)} characters: {_snippet(line)}")
        return
    try:
        parsed = reference_line(line)
    except Exception as e:  # prometheus_client raises ValueError, but junk can raise others
        out.reject(n, f"{type(e).__name__}: {_snippet(str(e))}; line: {_snippet(line)}")
        return
    for name, labels, value in parsed:
        pivot.route((n, name, tuple(labels.items()), labels, value), out.samples)


def reference_line(line: str) -> list[tuple[str, dict[str, str], Value]]:
    """One line parsed by prometheus_client alone (no HELP/TYPE context, so no `_total` renaming)."""
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(line) for s in fam.samples]


def _snippet(s: str, limit: int = 80) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "...")
