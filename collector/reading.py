"""A query's rows from DuckDB, the statement planned once: how every reader of the store asks.

DuckDB 2.0's `con.sql(query, params=...)` is a lazy relation: it parses and binds the statement
at the call and plans it again when its rows are read - a second planning of every query (~10 ms
of the raw edges' holders, a join over the store's views; ~0.2 s of the demo's `gpufleet
analyze`, ~0.2 s of a 1,024-GPU week's, 7-12 % of each). `con.execute` plans it once. DuckDB then
advises, in a UserWarning at every call, that Arrow output from an executed statement copies its
rows once more: measured, the copy (~20 ms per 3M rows) costs less than the planning it saves. That
advice alone, attributed to this module, is ignored (a filter added at a read, not at import);
every other warning stands.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

# DuckDB's advice at each Arrow read of an executed statement (duckdb/_relation.py), matched by its
# start, and the filter that ignores it when this module reads (as warnings.filterwarnings keeps it)
_COPY_ADVICE = "Arrow output on a DB-API result makes an extra copy of the rows"
_IGNORED = ("ignore", re.compile(re.escape(_COPY_ADVICE), re.I), UserWarning, re.compile(re.escape(__name__)), 0)


def query_rows(con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any] | None = None) -> pa.Table:
    """The rows of `query` with its $parameters bound from `params`, as an Arrow table."""
    if warnings.filters[:1] != [_IGNORED]:  # (first, again, where a caller changed the filters: pytest, catch_warnings, -W error)
        warnings.filterwarnings(*_IGNORED[:1], message=_IGNORED[1].pattern, category=UserWarning, module=_IGNORED[3].pattern)
    return (con.execute(query, dict(params)) if params else con.execute(query)).to_arrow_table()

