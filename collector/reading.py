"""A query's rows from DuckDB, the statement planned once: how every reader of the store asks.

DuckDB 2.0's `con.sql(query, params=...)` is a lazy relation: it binds the statement at the call
and plans it again when its rows are read; `con.execute` plans it once. DuckDB then advises, in a
UserWarning at every call, that Arrow output from an executed statement copies its rows once more:
the copy costs less than the planning it saves (docs/performance.md, stop 77). That advice alone,
attributed to this module, is ignored (a filter added at a read, not at import); every other
warning stands.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from gpufleet.collector.schema import SEEN_FLOOR

# DuckDB's advice at each Arrow read of an executed statement (duckdb/_relation.py), matched by its
# start, and the filter that ignores it when this module reads, as warnings.filterwarnings stores it
_COPY_ADVICE = re.escape("Arrow output on a DB-API result makes an extra copy of the rows")
_MODULE = re.escape(__name__)
_IGNORED = ("ignore", re.compile(_COPY_ADVICE, re.I), UserWarning, re.compile(_MODULE), 0)


def query_rows(con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any] | None = None) -> pa.Table:
    """The rows of `query` with its $parameters bound from `params`, as an Arrow table."""
    if warnings.filters[:1] != [_IGNORED]:  # (first, again, where a caller changed the filters: pytest, catch_warnings, -W error)
        warnings.filterwarnings("ignore", message=_COPY_ADVICE, category=UserWarning, module=_MODULE)
    return (con.execute(query, dict(params)) if params else con.execute(query)).to_arrow_table()


def first_row(con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
    """The first row of `query`, read on a cursor of its own (a reader connection is shared between threads and sessions)."""
    cur = con.cursor()
    try:
        return (cur.execute(query, dict(params)) if params else cur.execute(query)).fetchall()[0]
    finally:
        cur.close()


def seen_floor(con: duckdb.DuckDBPyConnection, since: Any, max_gap_s: float) -> Any:
    """SEEN_FLOOR at `since` (a naive UTC datetime): the $seen_floor of a read of allocations_ending_after at `since` or
    later (None: no floor), read on a cursor of its own."""
    return first_row(con, SEEN_FLOOR, {"since": since, "max_gap": max_gap_s})[0]
