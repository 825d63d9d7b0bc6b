"""The analytics' SQL helpers (gpufleet.analytics.sql)."""

from __future__ import annotations

import duckdb

from gpufleet.analytics.sql import bound


def test_bound_binds_the_parameters_a_query_names_whole():
    values = {"bucket": 300, "bucket_us": 300_000_000, "start": 1, "xstart": 2}
    assert bound("SELECT $bucket_us, $xstart", values) == {"bucket_us": 300_000_000, "xstart": 2}
    assert bound("SELECT $bucket + $start", values) == {"bucket": 300, "start": 1}
    # what DuckDB takes: a parameter the query does not name is refused
    con = duckdb.connect()
    assert con.execute("SELECT $bucket_us", bound("SELECT $bucket_us", values)).fetchone() == (300_000_000,)
