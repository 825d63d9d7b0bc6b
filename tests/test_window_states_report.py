"""The weekly report's "what held your GPUs back" (the store of tests/test_report.py): each team's
three largest losses are gpufleet.analytics.window_states' for the report's own analysis, printed
as the report's formatter writes them, in the fleet's report and only its own in a team's."""

from __future__ import annotations

from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.states import Thresholds
from gpufleet.analytics.window_states import window_states
from gpufleet.report import fmt
from tests.test_report import Figures, outputs, store, w47  # noqa: F401


def test_what_held_your_gpus_back_is_the_window_states_one(outputs):
    o = outputs[0]
    a = o.report.extra["analysis"]
    want = window_states(a, Thresholds.of(a.p, {})).team_causes(3).to_dicts()
    assert want and o.report.held_back == want
    figs = Figures(o.html)
    for c in want:
        k = f"held_back.{c['cluster']}/{c['account']}.{c['state']}"
        assert figs.one(f"{k}.gpu_h") == fmt.hours(c["gpu_h"])
        assert figs.one(f"{k}.cost") == ("unknown" if c["cost"] is None else fmt.usd(c["cost"]))
        assert figs.one(f"{k}.share") == fmt.pct(c["share_pct"])
    assert "WHAT HELD YOUR GPUS BACK" in o.text and "open the job" in o.text
    # each cause in the vocabulary's words (as the pages write states), and what sets idle and no process apart from the figures
    held = o.text[o.text.index("WHAT HELD YOUR GPUS BACK"):]
    assert all(words.state(c["state"]) in held for c in want)
    assert "first cause that matches" in held and "first of these that matches" in o.html
    # at most three causes a team, largest first
    for team in {c["account"] for c in want}:
        mine = [c["gpu_h"] for c in want if c["account"] == team]
        assert len(mine) <= 3 and mine == sorted(mine, reverse=True)


def test_a_teams_report_has_only_its_causes(outputs):
    team = outputs[1]
    assert team.report.held_back and {c["account"] for c in team.report.held_back} == {team.report.team}
    assert {k.split(".")[1].split("/")[1] for k in Figures(team.html).figs if k.startswith("held_back.")} == {team.report.team}
