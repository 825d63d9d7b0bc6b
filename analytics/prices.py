"""$ per GPU-hour by GPU model: the shipped table (analytics/data/prices.csv) with the
configuration's overrides, and the one way a model column is priced - a model with no price is
null (unknown), never $0."""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources
from typing import Mapping

import polars as pl


@cache
def default_prices() -> dict[str, float]:
    with resources.files("gpufleet.analytics.data").joinpath("prices.csv").open() as f:
        return {row["model"]: float(row["usd_per_gpu_hour"]) for row in csv.DictReader(f)}


def price_table(overrides: Mapping[str, float]) -> dict[str, float]:
    return {**default_prices(), **overrides}


def usd_per_gpu_hour(prices: Mapping[str, float], model: str = "model") -> pl.Expr:
    """The $/GPU-hour of each row's `model` (null where the table has no price for it)."""
    return pl.col(model).replace_strict(dict(prices), default=None, return_dtype=pl.Float64)
