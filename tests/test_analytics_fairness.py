"""Fairness golden tests: every expected number is worked out by hand here, in the expressions."""

from __future__ import annotations

from datetime import datetime, timedelta
from math import log

import duckdb
import pytest

from gpufleet.analytics import params
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.fairness import (
    ACCOUNT_SCHEMA, BUCKETS, OPTIONS, fairness, gini, jain_index, parse_sshare, settings, sshare_shares,
)
from gpufleet.config import ConfigError, section
from tests.support.fleet import Fleet

W0, W1 = datetime(2024, 6, 1), datetime(2024, 6, 2)  # a one-day window
H, DAY = timedelta(hours=1), timedelta(days=1)


def ran(f: Fleet, key: str, account: str, user: str, gpus: int, start: datetime, hours: float, wait_s: float = 0) -> None:
    f.job(key, account=account, user=user, gpus=gpus, start=start, end=start + hours * H, placements=[],
          submit=start - timedelta(seconds=wait_s))


def queued(f: Fleet, key: str, account: str, user: str, gpus: int, submit: datetime, start: datetime | None = None,
           end: datetime | None = None) -> None:
    """A job that had not started by the window end."""
    f.job(key, account=account, user=user, gpus=gpus, start=start, end=end, placements=[], submit=submit,
          state="CANCELLED" if end else "PENDING")


def report(tmp_path, build, shares=None, half_life=timedelta(days=7)):
    f = Fleet(tmp_path / "store")
    build(f)
    f.write()
    a = Analysis(f.reader(), params.Params(W0, W1), now=W1 + DAY)  # as_of = the window end
    return fairness(a, shares, half_life)


def rows(r) -> dict[str, dict]:
    return {row["account"]: row for row in r.per_account.iter_rows(named=True)}


# --- used vs entitled, Jain ---


def test_use_in_proportion_to_unequal_shares_is_fair(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=10, start=W0 + H, hours=3)  # 10 x 3 = 30 GPU-h
        ran(f, "2", "biology", "carol", gpus=5, start=W0 + H, hours=2)  # 5 x 2 = 10 GPU-h

    r = report(tmp_path, build, {"physics": 0.75, "biology": 0.25})
    acc = rows(r)
    assert acc["physics"]["used_gpu_h"] == pytest.approx(30) and acc["biology"]["used_gpu_h"] == pytest.approx(10)
    assert acc["physics"]["used_share"] == pytest.approx(30 / 40)
    assert acc["biology"]["used_share"] == pytest.approx(10 / 40)
    assert acc["physics"]["ratio"] == pytest.approx((30 / 40) / 0.75)  # = 1.0
    assert acc["biology"]["ratio"] == pytest.approx((10 / 40) / 0.25)  # = 1.0
    assert r.jain_index == pytest.approx((1 + 1) ** 2 / (2 * (1**2 + 1**2)))  # = 1
    assert r.per_account.columns == list(ACCOUNT_SCHEMA)
    assert r.shares_source == "config"


def test_use_against_shares_is_unfair(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=5, start=W0 + H, hours=2)  # 10 GPU-h
        ran(f, "2", "biology", "carol", gpus=10, start=W0 + H, hours=3)  # 30 GPU-h

    r = report(tmp_path, build, {"physics": 3, "biology": 1})  # weights: 3/4 and 1/4
    acc = rows(r)
    assert acc["physics"]["entitled_share"] == pytest.approx(3 / 4)
    assert acc["physics"]["ratio"] == pytest.approx((10 / 40) / (3 / 4))  # 1/3
    assert acc["biology"]["ratio"] == pytest.approx((30 / 40) / (1 / 4))  # 3
    assert r.jain_index == pytest.approx((1 / 3 + 3) ** 2 / (2 * ((1 / 3) ** 2 + 3**2)))  # (100/9)/(164/9) = 0.6098
    assert r.jain_index == pytest.approx(100 / 164)


def test_account_without_demand_is_not_judged_and_one_without_share_is_named(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=10, start=W0 + H, hours=3)  # 30 GPU-h
        ran(f, "2", "biology", "carol", gpus=5, start=W0 + H, hours=2)  # 10 GPU-h
        ran(f, "3", "chemistry", "dora", gpus=1, start=W0 - 3 * H, hours=1)  # ended before the window: past use, no demand
        queued(f, "4", "guest", "gus", gpus=1, submit=W0 + 2 * H)  # demand, but no share

    r = report(tmp_path, build, {"physics": 3, "biology": 1, "chemistry": 4})
    acc = rows(r)
    assert acc["physics"]["entitled_share"] == pytest.approx(3 / 8)  # over all weights, like NormShares
    assert acc["chemistry"]["entitled_share"] == pytest.approx(4 / 8)
    assert acc["physics"]["active_share"] == pytest.approx(3 / 4)  # over accounts with demand: 3 / (3 + 1)
    assert acc["physics"]["ratio"] == pytest.approx((30 / 40) / (3 / 4))  # 1.0
    assert acc["biology"]["ratio"] == pytest.approx((10 / 40) / (1 / 4))  # 1.0
    assert acc["chemistry"]["jobs"] == 0 and acc["chemistry"]["ratio"] is None
    assert acc["guest"]["jobs"] == 1 and acc["guest"]["ratio"] is None and acc["guest"]["entitled_share"] == 0.0
    assert acc["guest"]["fairshare_factor"] == 0.0  # no share: Slurm's lowest factor
    assert r.without_share == ("guest",)
    assert r.jain_index == pytest.approx(1.0)  # over physics and biology only


# --- Gini over users ---


def test_gini_over_users_counts_users_who_got_nothing(tmp_path):
    def build(f):
        queued(f, "1", "physics", "u0", gpus=1, submit=W0 + H)  # demand, 0 GPU-h
        ran(f, "2", "physics", "u10", gpus=5, start=W0 + H, hours=2)  # 10 GPU-h
        ran(f, "3", "physics", "u30", gpus=10, start=W0 + H, hours=3)  # 30 GPU-h

    r = report(tmp_path, build)
    # sorted x = 0, 10, 30; n = 3: ((2-4)*0 + (4-4)*10 + (6-4)*30) / (3 * 40) = 60 / 120
    assert r.gini_users == pytest.approx(0.5)
    assert gini([10, 30]) == pytest.approx((-1 * 10 + 1 * 30) / (2 * 40))  # 0.25 without the user who got nothing
    assert gini([0, 0, 10]) == pytest.approx(2 / 3)  # one user has everything: (n-1)/n
    assert gini([5, 5]) == 0.0 and gini([]) is None and gini([0, 0]) is None
    assert jain_index([1, 0]) == pytest.approx(1 / 2)  # one of two takes everything: 1/n
    assert rows(r)["physics"]["ratio"] == pytest.approx(1.0)  # shares None: equal, and one account has it all
    assert r.shares_source == "equal"  # and every output says so


# --- classic fair-share factor with decay ---


def test_fairshare_factor_decays_past_usage_by_half_life(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=2, start=W1 - 7 * DAY - H / 2, hours=1)  # 2 GPU-h, 7 days old: counts ~1/2
        ran(f, "2", "biology", "carol", gpus=4, start=W1 - 14 * DAY - H / 2, hours=1)  # 4 GPU-h, 14 days old: counts ~1/4

    r = report(tmp_path, build, {"physics": 0.75, "biology": 0.25})
    acc = rows(r)
    assert acc["physics"]["decayed_gpu_h"] == pytest.approx(2 * 0.5, rel=1e-5)  # 1 GPU-h
    assert acc["biology"]["decayed_gpu_h"] == pytest.approx(4 * 0.25, rel=1e-5)  # 1 GPU-h
    # exactly: 2 GPUs x the integral of 2^(-age/h) over ages 7d - 30 min .. 7d + 30 min
    h = 7 * 86400
    exact = 2 * h / log(2) * (2 ** (-(7 * 86400 - 1800) / h) - 2 ** (-(7 * 86400 + 1800) / h)) / 3600
    assert acc["physics"]["decayed_gpu_h"] == pytest.approx(exact, rel=1e-9)
    # U = 1 / (1 + 1) = 0.5 each; F = 2^(-U/S)
    assert acc["physics"]["fairshare_factor"] == pytest.approx(2 ** (-0.5 / 0.75), abs=1e-5)  # 0.630
    assert acc["biology"]["fairshare_factor"] == pytest.approx(2 ** (-0.5 / 0.25), abs=1e-5)  # 0.25
    # no demand in the window: no ratios, no Jain, but the factors stand
    assert acc["physics"]["ratio"] is None and r.jain_index is None

    r14 = report(tmp_path / "b", build, {"physics": 0.75, "biology": 0.25}, half_life=timedelta(days=14))
    acc = rows(r14)
    phys, bio = 2 * 2**-0.5, 4 * 2**-1  # 1.414 and 2 GPU-h
    assert acc["physics"]["fairshare_factor"] == pytest.approx(2 ** (-(phys / (phys + bio)) / 0.75), abs=1e-5)


# --- queue wait ---


def test_queue_wait_percentiles_by_account_and_size_and_pending(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=1, start=W0 + 1 * H, hours=1, wait_s=0)
        ran(f, "2", "physics", "alice", gpus=2, start=W0 + 2 * H, hours=1, wait_s=60)
        ran(f, "3", "physics", "bob", gpus=4, start=W0 + 3 * H, hours=1, wait_s=120)
        ran(f, "4", "physics", "bob", gpus=8, start=W0 + 4 * H, hours=1, wait_s=600)
        ran(f, "5", "biology", "carol", gpus=16, start=W0 + 5 * H, hours=1, wait_s=3600)
        ran(f, "6", "physics", "alice", gpus=1, start=W0 - H, hours=3, wait_s=5 * 3600)  # started before: not a wait here
        ran(f, "7", "physics", "alice", gpus=0, start=W0 + H, hours=1, wait_s=10_000)  # CPU-only: not GPU demand
        queued(f, "8", "biology", "carol", gpus=2, submit=W1 - 2 * H)  # waiting 7200 s at the end
        queued(f, "9", "physics", "bob", gpus=1, submit=W0 - H)  # waiting all window: 25 h = 90000 s
        queued(f, "10", "physics", "bob", gpus=16, submit=W1 - H / 2, start=W1 + H)  # started after: pending at the end
        queued(f, "11", "physics", "bob", gpus=1, submit=W0 + H, end=W0 + 2 * H)  # cancelled while pending: gone

    r = report(tmp_path, build)
    acc = rows(r)
    # physics waits sorted 0, 60, 120, 600; linear between closest ranks at position (n-1)p:
    # p50: 1.5 -> 60 + 0.5 * (120 - 60) = 90;  p95: 2.85 -> 120 + 0.85 * (600 - 120) = 528
    assert acc["physics"]["wait_p50_s"] == pytest.approx(90)
    assert acc["physics"]["wait_p95_s"] == pytest.approx(528)
    assert acc["physics"]["started_jobs"] == 4 and acc["physics"]["pending_jobs"] == 2
    assert acc["physics"]["jobs"] == 4 + 1 + 3  # started, running from before, pending or cancelled in the window
    assert acc["biology"]["wait_p50_s"] == acc["biology"]["wait_p95_s"] == 3600
    # the definition is DuckDB's quantile_cont on doubles (not quantile_disc, which gives 60 for the median)
    cont = duckdb.sql("SELECT quantile_cont(w, [0.5, 0.95]) FROM (VALUES (0.0::DOUBLE), (60), (120), (600)) t(w)").fetchall()[0][0]
    assert cont == pytest.approx([90, 528])

    size = {row["gpus_bucket"]: row for row in r.wait_by_size.iter_rows(named=True)}
    assert list(size) == list(BUCKETS)
    assert (size["1"]["started_jobs"], size["1"]["wait_p50_s"], size["1"]["pending_jobs"]) == (1, 0, 1)
    assert size["2-4"]["wait_p50_s"] == pytest.approx(90)  # 60, 120: position 0.5
    assert size["2-4"]["wait_p95_s"] == pytest.approx(60 + 0.95 * (120 - 60))  # 117
    assert (size["5-8"]["wait_p50_s"], size["5-8"]["pending_jobs"]) == (600, 0)
    assert (size["9+"]["wait_p95_s"], size["9+"]["pending_jobs"]) == (3600, 1)

    assert r.pending["job_key"].to_list() == ["9", "8", "10"]  # longest wait first
    assert r.pending["wait_s"].to_list() == [25 * 3600, 2 * 3600, 1800]


def test_analyze_json_lists_the_longest_waits_and_counts_every_pending_job(tmp_path):
    """`gpufleet analyze`'s fairness.pending: the --top jobs waiting longest, and pending_jobs how many wait in all (the
    answer does not grow with the queue; the Teams page still lists them all)."""
    from gpufleet.analytics import cli

    f = Fleet(tmp_path / "store")
    ran(f, "1", "physics", "alice", gpus=1, start=W0 + H, hours=1)
    for i, hours in enumerate((3, 20, 1, 7, 12)):
        queued(f, f"q{i}", "physics", "bob", gpus=1, submit=W1 - hours * H)
    f.write()
    p = params.Params(W0, W1)
    for top in (0, 2, 10):
        doc = cli.build_report(f.reader(), p, "account", top, None, now=W1 + DAY)["fairness"]
        assert doc["pending_jobs"] == 5
        assert [j["job_key"] for j in doc["pending"]] == ["q1", "q4", "q3", "q0", "q2"][:top]
        assert [j["wait_s"] for j in doc["pending"]] == [h * 3600 for h in (20, 12, 7, 3, 1)][:top]


def test_jobs_of_unknown_gpu_count_are_unknown_demand_said_not_dropped(tmp_path):
    """Issue #51: a job whose GPU count is unknown is no known demand and no usage of 0 GPU-hours:
    an account with only those has unknown usage and no ratio, named in unknown_demand (out of
    Jain's index); their queue waits are known, under the size "unknown"."""
    def build(f):
        ran(f, "1", "physics", "alice", gpus=2, start=W0 + 1 * H, hours=2, wait_s=60)
        ran(f, "2", "biology", "carol", gpus=None, start=W0 + 2 * H, hours=1, wait_s=600)
        queued(f, "3", "biology", "carol", gpus=None, submit=W1 - 2 * H)

    r = report(tmp_path, build)
    acc = rows(r)
    assert r.unknown_demand == ("biology",) and r.without_share == ()
    assert acc["biology"]["used_gpu_h"] is None and acc["biology"]["ratio"] is None and acc["biology"]["gpus_unknown_jobs"] == 1
    assert acc["physics"]["used_gpu_h"] == pytest.approx(4.0) and acc["physics"]["gpus_unknown_jobs"] == 0
    size = {row["gpus_bucket"]: row for row in r.wait_by_size.iter_rows(named=True)}
    assert list(size) == [*BUCKETS, "unknown"]
    assert (size["unknown"]["started_jobs"], size["unknown"]["wait_p50_s"], size["unknown"]["pending_jobs"]) == (1, 600, 1)
    assert r.pending["job_key"].to_list() == ["3"] and r.pending["gpus_bucket"].to_list() == ["unknown"]


# --- empty window ---


def test_empty_window_gives_none_and_empty_frames(tmp_path):
    def build(f):
        ran(f, "1", "physics", "alice", gpus=1, start=W1 + DAY, hours=1)  # after the window

    r = report(tmp_path, build)
    assert r.per_account.is_empty() and r.per_account.columns == list(ACCOUNT_SCHEMA)
    assert r.jain_index is None and r.gini_users is None and r.pending.is_empty() and r.without_share == ()
    assert r.wait_by_size["started_jobs"].to_list() == [0, 0, 0, 0]
    assert r.wait_by_size["wait_p50_s"].null_count() == 4

    r = report(tmp_path / "b", lambda f: None, {"physics": 1})
    acc = rows(r)
    assert acc["physics"]["ratio"] is None and acc["physics"]["used_share"] is None
    assert acc["physics"]["fairshare_factor"] == 1.0  # no usage at all: 2^0


# --- sshare ---

# `sshare -P -a -o Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare` on Slurm 22.05
# (Fair Tree, the default: account rows have no FairShare). physics has sub-accounts astro and hep;
# root's own user association takes 1 of the 61 shares under root.
SSHARE = """\
Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare
root|||0.000000|1843205710|1.000000|
 root|root|1|0.016393|0|0.000000|1.000000
 biology||20|0.327869|402115530|0.218161|
  biology|carol|1|0.500000|402115530|1.000000|0.312500
  biology|dave|1|0.500000|0|0.000000|0.937500
 physics||40|0.655738|1441090180|0.781839|
  astro||1|0.250000|305667|0.000212|
   astro|erin|parent|0.250000|305667|1.000000|0.687500
  hep||3|0.750000|1440784513|0.999788|
   hep|alice|1|0.500000|1152627610|0.800000|0.125000
   hep|bob|1|0.500000|288156903|0.200000|0.562500
"""


def test_parse_sshare_and_leaf_account_shares(tmp_path):
    parsed = parse_sshare(SSHARE)
    assert len(parsed) == 11
    root, hep, alice, erin = parsed[0], parsed[8], parsed[9], parsed[7]
    assert (root.account, root.user, root.depth, root.raw_shares, root.norm_shares) == ("root", "", 0, "", 0.0)
    assert (hep.account, hep.user, hep.depth, hep.norm_shares, hep.fairshare) == ("hep", "", 2, 0.75, None)
    assert (alice.account, alice.user, alice.depth, alice.raw_usage, alice.fairshare) == ("hep", "alice", 3, 1152627610, 0.125)
    assert erin.raw_shares == "parent"
    # `sshare -p` ends every line with '|': the same rows
    assert parse_sshare("\n".join(line + "|" for line in SSHARE.splitlines())) == parsed

    shares = sshare_shares(parsed)  # leaves only; NormShares multiplied down the tree
    assert shares == pytest.approx({"biology": 0.327869, "astro": 0.655738 * 0.25, "hep": 0.655738 * 0.75})
    r = report(tmp_path, lambda f: None, shares)
    acc = rows(r)  # renormalised: 20 : 40*1/4 : 40*3/4 = 20 : 10 : 30 of 60
    assert acc["biology"]["entitled_share"] == pytest.approx(20 / 60, abs=1e-6)
    assert acc["astro"]["entitled_share"] == pytest.approx(10 / 60, abs=1e-6)
    assert acc["hep"]["entitled_share"] == pytest.approx(30 / 60, abs=1e-6)


# --- config ---


def test_options_for_the_analytics_section():
    opts = section({"analytics": {"shares": {"physics": 3, "biology": 1}, "half_life_days": 3.5}}, "analytics",
                   params.OPTIONS + OPTIONS, "gpufleet.toml")
    assert settings(opts) == ({"physics": 3.0, "biology": 1.0}, timedelta(days=3.5))
    assert settings(section({}, "analytics", params.OPTIONS + OPTIONS, None)) == (None, timedelta(days=7))
    with pytest.raises(ConfigError, match="shares"):
        section({"analytics": {"shares": {"physics": -1}}}, "analytics", params.OPTIONS + OPTIONS, "gpufleet.toml")
    with pytest.raises(ConfigError, match="half_life_days"):
        section({"analytics": {"half_life_days": 0}}, "analytics", params.OPTIONS + OPTIONS, "gpufleet.toml")
