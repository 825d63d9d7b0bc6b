"""gpufleet analytics: pure functions over the store (DuckDB SQL + polars)."""
