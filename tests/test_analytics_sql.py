"""The analytics' SQL helpers (gpufleet.analytics.sql)."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from gpufleet.analytics.sql import bound, inlined


def test_bound_binds_the_parameters_a_query_names_whole():
    values = {"bucket": 300, "bucket_us": 300_000_000, "start": 1, "xstart": 2}
    assert bound("SELECT $bucket_us, $xstart", values) == {"bucket_us": 300_000_000, "xstart": 2}
    assert bound("SELECT $bucket + $start", values) == {"bucket": 300, "start": 1}
    # what DuckDB takes: a parameter the query does not name is refused
    con = duckdb.connect()
    assert con.execute("SELECT $bucket_us", bound("SELECT $bucket_us", values)).fetchone() == (300_000_000,)


def test_inlined_values_read_as_their_parameters_do():
    """A view takes no parameters (facts.FactWindow in_place): its values are written in, and must read back the same."""
    query = "SELECT $none, $yes, $small, $big, $quoted, $paths, $at, $buckets"
    values = {"none": None, "yes": True, "small": 1.5e-7, "big": 1_777_000_000_000_000, "quoted": "it's",
              "paths": ["/a/b.parquet", "/c/d'e.parquet"], "at": datetime(2026, 11, 2, 3, 4, 5, 6), "buckets": [300, 600]}
    con = duckdb.connect()
    assert con.execute(inlined(query, values)).fetchone() == con.execute(query, values).fetchone()
    with pytest.raises(TypeError, match="naive datetime"):
        inlined("SELECT $at", {"at": datetime(2026, 11, 2, tzinfo=timezone.utc)})
