"""Retention of the facts ([collector.retention] facts_5m_days, facts_days; maintenance.retire_facts):
whole days go, each grain no sooner than what upkeep builds it from, and upkeep does not build
again what retention retired; a window over the kept days still reads its facts."""

from __future__ import annotations

from datetime import timedelta

from test_analytics_properties import MAX_GAP, at
from test_facts import NOTHING, params, store

from gpufleet.analytics.facts import FactWindow
from gpufleet.collector import facts as cf
from gpufleet.collector.config import RETENTION
from gpufleet.collector.maintenance import apply_retention, build_facts, rebuild_facts
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.times import epoch_us

DAY = 86400


def fleet(days: int) -> dict:
    return {"gpus": [{"gpu": 0, "host": "h0", "uuid": "GPU-prop-0", "samples": [(t, 40.0, 1.0) for t in range(0, days * DAY, 60)]}],
            "jobs": [], "cuts": [0, DAY, 2 * DAY], "now": days * DAY + 3600, "idle_min": 300}


def kept(w: StoreWriter) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {"5m": set(), "day": set()}
    for e in w.facts.values():
        out[e["grain"]].add(e["bucket"][:10])
    return out


def test_the_settings_are_named_with_the_other_retention_keys():
    defaults = {o.key: o.default for o in RETENTION}
    assert defaults["facts_5m_days"] == 35 and defaults["facts_days"] == 400


def test_retention_retires_whole_days_of_each_grain_and_upkeep_leaves_them_retired(tmp_path):
    f = fleet(4)
    store(tmp_path, f, (1, False), 5 * DAY)
    fp = cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=f["idle_min"])
    w = StoreWriter(tmp_path)
    days = [at(d * DAY).isoformat()[:10] for d in range(4)]
    assert kept(w) == {"5m": set(days), "day": set(days)}
    now = at(4 * DAY + 12 * 3600)
    # raw samples kept longer than the 5-minute facts would be: those stay (upkeep would build them again)
    assert apply_retention(w, now, raw_days=400, facts_5m_days=1, facts_days=2) == 0
    assert kept(w) == {"5m": set(days), "day": set(days)}
    # raw samples 1 day: days that ended 1 day before now lose their 5-minute facts, 2 days before their day facts too
    retired = apply_retention(w, now, raw_days=1, facts_5m_days=1, facts_days=2)
    assert kept(w) == {"5m": set(days[3:]), "day": set(days[2:])}
    assert retired >= 3 * 24 + 2  # the 5-minute facts of 3 days (24 hours each), 2 day files, and sample files
    # upkeep finds nothing to build: no sample file, no hour of a retired day
    assert build_facts(w, epoch_us(now), fp) == NOTHING
    assert kept(w) == {"5m": set(days[3:]), "day": set(days[2:])}
    # nor a rebuild of the whole store: a day with neither samples nor 5-minute facts left keeps its day facts
    assert rebuild_facts(w, now, fp)["days"] == 1  # (the last day's, from its 5-minute facts)
    assert kept(w) == {"5m": set(days[3:]), "day": set(days[2:])}
    # a day's hour facts are its day file's: the day file kept stands for its hours without its 5-minute facts
    w.publish()
    w.close()
    con = open_reader(tmp_path)
    fw = FactWindow(con, params(f, 2 * DAY, 3 * DAY), now=now)
    assert fw.tiles[cf.GRAIN_1D] == 1 and fw.raw_us == 0  # (and 5-minute facts of the next day, in the reach after the window)
    assert fw.totals()["data_gpu_h"] == 12.0  # (a sample a minute holds max_gap, 30 s)
    fw.close()


def test_hour_and_day_facts_outlive_the_five_minute_ones_they_are_built_from(tmp_path):
    """facts_days below facts_5m_days: a day's hour and day facts stay while its 5-minute facts do
    (upkeep would build them again from those)."""
    store(tmp_path, fleet(2), (1, False), 3 * DAY)
    w = StoreWriter(tmp_path)
    now = at(2 * DAY + 3600) + timedelta(days=3)
    assert apply_retention(w, now, raw_days=400, facts_5m_days=400, facts_days=1) == 0
    assert len(kept(w)["day"]) == 2
    w.close()
