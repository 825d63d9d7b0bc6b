"""The one vocabulary and the one way figures are written (gpufleet.analytics.vocabulary), and the
dashboards' one table formatter built on it (gpufleet.dashboards.ui.people)."""

from __future__ import annotations

import math
import re

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.analytics import vocabulary as words

UNITS = {"d": 86400, "h": 3600, "min": 60, "s": 1}
TWO_UNITS = re.compile(r"^(\d+) (d|h|min|s)(?: (\d+) (h|min|s))?$")


@pytest.mark.parametrize("seconds, text", [(46, "46 s"), (86, "1 min 26 s"), (60, "1 min"), (2 * 3600 + 48 * 60, "2 h 48 min"),
                                           (3 * 3600 + 30 * 60, "3 h 30 min"), (3 * 3600, "3 h"), (3 * 86400 + 4 * 3600, "3 d 4 h"),
                                           (0, "0 s"), (None, "unknown"), (float("nan"), "unknown")])
def test_waits_in_two_significant_units(seconds, text):
    assert words.duration(seconds) == text


@pytest.mark.parametrize("seconds, text", [(24 * 3600 + 45 * 60, "1 d 45 min"), (7 * 86400 + 12 * 60, "7 d 12 min"), (6 * 3600, "6 h"),
                                           (86400 + 2 * 3600 + 60, "1 d 2 h 1 min"), (42, "42 s"), (None, "unknown")])
def test_a_window_s_length_keeps_every_unit_to_the_minute(seconds, text):
    """A relative window's caption: a day's window started back on the hour is 24 h 45 min long, not "1 d" (duration's two units)."""
    assert words.span(seconds) == text


@given(st.integers(min_value=1, max_value=400 * 1440))
def test_a_span_reads_back_exactly(minutes):
    text = words.span(minutes * 60)
    assert sum(int(n) * UNITS[u] for n, u in re.findall(r"(\d+) (d|h|min)", text)) == minutes * 60, text


@given(st.floats(min_value=0, max_value=400 * 86400, allow_nan=False))
def test_a_duration_reads_back_within_its_smaller_unit(seconds):
    text = words.duration(seconds)
    m = TWO_UNITS.match(text)
    assert m, text
    big, small = m.group(2), m.group(4)
    names = list(UNITS)
    if small is not None:  # adjacent units, the smaller below one of the bigger
        assert names.index(small) == names.index(big) + 1 and int(m.group(3)) * UNITS[small] < UNITS[big], text
    value = int(m.group(1)) * UNITS[big] + (int(m.group(3)) * UNITS[small] if small else 0)
    resolution = UNITS[small or names_after(big)]
    assert value <= round(seconds) < value + resolution, (seconds, text)


def names_after(unit: str) -> str:
    names = list(UNITS)
    return names[min(names.index(unit) + 1, len(names) - 1)]


@given(st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_one_decimal_for_gpu_hours_and_percentages_cents_for_money(x):
    if math.isnan(x) or math.isinf(x):
        assert words.gpu_h(x) == words.pct(x) == words.usd(x) == words.UNKNOWN
        return
    assert re.fullmatch(r"-?[\d,]+\.\d", words.gpu_h(x)), words.gpu_h(x)
    assert re.fullmatch(r"<?-?\d+\.\d %", words.pct(x)), words.pct(x)
    assert re.fullmatch("\u2212?\\$[\\d,]+\\.\\d\\d", words.usd(x)), words.usd(x)


def test_used_names_no_term():
    assert "used" not in " ".join(words.TERMS.values()).split()
    assert all("used" not in h.split() for h in words.HEADERS.values())
    assert words.header("used_gpu_h") == words.header("allocated_gpu_h") == "allocated GPU-h"
    row = words.with_new_keys({"account": "a", "used_gpu_h": 2.0, "used_share": 0.5})
    assert row["allocated_gpu_h"] == row["used_gpu_h"] == 2.0 and row["allocated_share"] == row["used_share"] == 0.5


def test_every_gpu_hours_column_of_the_tables_is_headed_by_a_term():
    """Each GPU-hours column the utilization tables give is headed by the vocabulary's term, not its key's words
    ("allocated data GPU-h" said nothing of what the time is)."""
    cols = {"capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h", "stranded_gpu_h", "allocated_gpu_h",
            "idle_gpu_h", "no_process_gpu_h", "held_data_gpu_h"}
    assert cols <= set(words.TERMS)
    assert words.header("allocated_data_gpu_h") == "allocated with data GPU-h"
    assert words.header("data_cost") == "with data $"  # (a breakdown's money of the time with data: not "data $")


@pytest.mark.parametrize("column, unit", [("idle_for_s", 1), ("mttf_ci_low_h", 3600), ("wall_h", 3600), ("requeue_wait_h", 3600),
                                          ("runtime_h", 3600), ("idle_gpu_h", None), ("cost_usd_per_h", None), ("job_hours", None)])
def test_a_duration_column_is_written_out_and_headed_without_a_unit(column, unit):
    """Every surface writes a duration column out ("25 s", "2 h 48 min": the CLI's fmt, the pages' display_text), so its
    header names no unit: the Reliability page's MTTF table read "mttf ci low h" over a cell "25 s". GPU-hours and money
    are no durations."""
    from gpufleet.analytics.cli import fmt
    from gpufleet.dashboards.ui import _duration_scale

    assert words.duration_unit_s(column) == unit == _duration_scale(column, pl.Float64)
    if unit:
        assert not re.search(r" (h|s)$", words.header(column)), words.header(column)
        assert fmt(90.0 / unit, column) == "1 min 30 s"


def test_memory_gpu_hours_and_p_values_in_the_cli_as_on_the_pages():
    """`--job`'s per-GPU table wrote "70,500.00" under "fb used max MiB"; the pages write whole MiB."""
    from gpufleet.analytics.cli import fmt
    from gpufleet.dashboards.ui import column_config

    assert fmt(70500.0, "fb_used_max_mib") == "70,500"
    # ... and a lemon's GPU-hours and p-value as the pages write them (not "1,088.02", "0.00")
    assert (fmt(1088.024, "gpu_hours"), words.header("gpu_hours")) == (words.gpu_h(1088.024), "GPU-h")
    assert fmt(1.234e-5, "p_value") == "1.2e-05"
    assert column_config(pl.DataFrame({"fb_used_max_mib": [70500.0]}))["fb_used_max_mib"]["type_config"]["format"] == "%,.0f"


def test_every_verdict_has_words():
    assert all("_" not in words.verdict(v) for v in words.VERDICTS)
    assert words.verdict(None) == words.NONE and words.verdict("ok") == "ok"


cells = st.one_of(st.none(), st.just(float("nan")), st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9))


@settings(deadline=None)  # (the first example imports streamlit)
@given(st.lists(st.tuples(cells, cells, st.one_of(st.none(), st.integers(-1, 6)), st.one_of(st.none(), st.sampled_from(list(words.VERDICTS))),
                          st.one_of(st.none(), st.text(max_size=5))), min_size=1, max_size=20))
def test_the_table_formatter_writes_no_raw_value(rows):
    pytest.importorskip("streamlit")
    from gpufleet.dashboards import ui

    df = pl.DataFrame(rows, schema={"idle_s": pl.Float64, "idle_gpu_h": pl.Float64, "gi": pl.Int64, "verdict": pl.Utf8, "reason": pl.Utf8},
                      orient="row")
    shown = ui.people(df)
    assert shown.height == df.height and shown.columns == df.columns  # no row lost, none added
    # a duration keeps its number (so its column sorts by value) and is written out by the table's display text
    assert [None if v is None or math.isnan(v) else v for v in df["idle_s"].to_list()] == shown["idle_s"].to_list()
    styled = ui.display_text(shown)
    col = shown.columns.index("idle_s")
    written = [c["display_value"] for row in styled._translate(False, False)["body"]  # (as Streamlit reads a Styler)
               for c in row if c.get("type") == "td" and c.get("id", "").endswith(f"_col{col}")]
    assert len(written) == df.height
    text = written + [v for c in ("gi", "verdict", "reason") for v in shown[c].to_list()]
    assert all(isinstance(v, str) for v in text)  # written out: no null for the grid to show as "None"
    assert not {"None", "NaN", "nan", "-1"} & set(text) - set(df["reason"].drop_nulls().to_list())
    assert not set(words.VERDICTS) - {"idle", "low", "ok"} & set(shown["verdict"].to_list())
    # a number left numeric keeps its value; NaN becomes null (shown as "unknown" by the table's placeholder)
    for got, was in zip(shown["idle_gpu_h"].to_list(), df["idle_gpu_h"].to_list()):
        assert (got is None) if (was is None or math.isnan(was)) else got == was


def test_a_tiny_share_reads_less_than_the_least_shown_never_zero():
    """A job's page listed 40 s of startup in a week as "0.0 %" under "share %": a percentage with some time too small
    for one decimal is written by vocabulary.pct on the pages as in the CLI ("<0.1 %"), and at a headline's whole
    percent "<1 %"; its cell keeps its number (sorts by value) and zero stays "0.0 %"."""
    pytest.importorskip("streamlit")
    from gpufleet.dashboards import ui

    assert (words.pct(0.04), words.pct(0.05), words.pct(0.0), words.pct(0.4, 0), words.pct(0.6, 0)) == ("<0.1 %", "0.1 %", "0.0 %", "<1 %", "1 %")
    shown = ui.people(pl.DataFrame({"share_pct": [99.97, 0.03, 0.0], "idle_share": [0.5, 0.0001, None]}))
    assert shown["share_pct"].to_list() == [99.97, 0.03, 0.0]
    styled = ui.display_text(shown)
    body = styled._translate(False, False)["body"]  # (as Streamlit reads a Styler)
    written = [[c["display_value"] for c in row if c.get("type") == "td"] for row in body]
    assert written == [["100.0 %", "50.0 %"], ["<0.1 %", "<0.1 %"], ["0.0 %", words.UNKNOWN]]
    assert all(ui.column_config(shown)[c]["type_config"]["format"] is None for c in shown.columns)
    # without a tiny value the table stays a frame, formatted by its columns' printf format
    plain = ui.people(pl.DataFrame({"share_pct": [99.97, 0.0]}))
    assert ui.display_text(plain) is plain and ui.column_config(plain)["share_pct"]["type_config"]["format"] == "%.1f %%"


@pytest.mark.parametrize("column, kind", [
    ("idle_cost", "usd"), ("usd_per_gpu_hour", "usd"), ("cost_usd_per_h", "usd"), ("idle_gpu_h", "gpu_h"), ("gpu_hours", "gpu_h"),
    ("runtime_h", "duration"), ("wait_p50_s", "duration"), ("utilization_pct", "pct"), ("mfu_pct", "pct"), ("allocated_share", "fraction"),
    ("mfu", "fraction"), ("ettr", "fraction"), ("fb_max_mib", "mib"), ("p_value", "p_value"), ("mfu_unknown_gpu_h", "gpu_h"), ("gpus", None), ("ratio", None)])
def test_a_column_s_kind_is_told_by_its_name_once_for_the_pages_and_the_cli(column, kind):
    """vocabulary.kind is the one rule: the pages' formats (ui._FORMATS) and the CLI's cells (cli.fmt) both follow it."""
    from gpufleet.analytics.cli import fmt
    from gpufleet.dashboards.ui import _FORMATS

    assert words.kind(column) == kind
    assert set(_FORMATS) == set(words.KINDS) - {"duration"}  # (a duration is written out, not formatted)
    if kind is not None:
        assert fmt(None, column) == words.UNKNOWN  # a figure of a kind missing is unknown, never a dash or 0
    shown = {"usd": "$1,234.57", "gpu_h": "1,234.6", "duration": words.duration(1234.567 * (words.duration_unit_s(column) or 1)),
             "pct": "1234.6 %", "fraction": "123456.7 %", "mib": "1,235", "p_value": "1.2e+03", None: "1,234.57"}[kind]
    assert fmt(1234.567, column) == shown


def test_a_listing_reads_as_a_sentence():
    assert [words.listing(x) for x in ([], ["a"], ["a", "b"], ["a", "b", "c"])] == ["", "a", "a and b", "a, b and c"]


@pytest.mark.parametrize("n, noun, text", [(0, "job", "0 jobs"), (1, "job", "1 job"), (1, "waiting job", "1 waiting job"),
                                           (2, "GPU", "2 GPUs"), (16384, "GPU", "16,384 GPUs")])
def test_a_quantity_is_singular_for_one_alone(n, noun, text):
    """One plural rule for every "n things" the surfaces write ("not counted: 1 waiting jobs" was the CLI's)."""
    assert words.quantity(n, noun) == text


def test_the_verb_agrees_with_the_quantity():
    """"1 job has", "2 jobs have": one rule for the warnings that count jobs (three wrote it by hand)."""
    assert [f"{words.quantity(n, 'job')} {words.have(n)}" for n in (0, 1, 2)] == ["0 jobs have", "1 job has", "2 jobs have"]
    assert words.unknown_gpu_counts(1).startswith("1 job of this window has an unknown GPU count")
    assert words.unknown_gpu_counts(3).startswith("3 jobs of this window have an unknown GPU count")


def test_a_small_positive_percentage_is_never_shown_as_none():
    """The report's "what held your GPUs back" listed a team's startup at 0.2 GPU-h as "0.0 %" of its time."""
    assert [words.pct(x) for x in (0.0, 0.01, 0.049, 0.05, 12.345)] == ["0.0 %", "<0.1 %", "<0.1 %", "0.1 %", "12.3 %"]
    assert words.pct(None) == words.UNKNOWN
