"""Shared fixtures. Real components (Prometheus, Alertmanager, Slurm) come from tests/realstack/:
when one is unavailable a test skips with the reason, or fails under CI=true (realstack.policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.realstack import prometheus as prom
from tests.realstack.slurm import SlurmCluster, start_slurm
from tests.realstack.policy import unavailable
from tests.support.shared_data import ABSENT_REASON, absent_shared_data_is_unavailable


def pytest_configure(config):
    """Hypothesis without its per-example deadline and slow-data health check: how fast an example
    runs is the benchmarks' business (bench/), and on a loaded CI machine a 200 ms deadline fails
    correct code at random."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the test extra is not installed: no hypothesis test runs either
        return
    settings.register_profile("gpufleet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("gpufleet")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test that opens a file of ../shared/data where the folder is absent skips with one line
    (fails under CI=true), instead of erroring with a traceback; so does a parameter set made
    without it (shared_json_params)."""
    if pyfuncitem.get_closest_marker("shared_data_absent"):
        unavailable(ABSENT_REASON)
    with absent_shared_data_is_unavailable():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The same for a fixture that reads ../shared/data."""
    with absent_shared_data_is_unavailable():
        return (yield)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return prom.prometheus_path()


@pytest.fixture(scope="session")
def promtool() -> str:
    return prom.promtool_path()


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    return prom.alertmanager_path()


@pytest.fixture(scope="session")
def amtool() -> str:
    return prom.amtool_path()


@pytest.fixture
def prometheus_factory(prometheus_bin, tmp_path_factory):
    """Call with (config_text=None, rule_files=(), port=None, extra_args=()) -> a running Prometheus."""
    started: list[prom.Prometheus] = []

    def start(config_text=None, rule_files=(), **kwargs) -> prom.Prometheus:
        server = prom.start_prometheus(tmp_path_factory.mktemp("prometheus"), config_text, rule_files, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def alertmanager_factory(alertmanager_bin, tmp_path_factory):
    """Call with (config_text=None, port=None, extra_args=()) -> a running Alertmanager."""
    started: list[prom.Alertmanager] = []

    def start(config_text=None, **kwargs) -> prom.Alertmanager:
        server = prom.start_alertmanager(tmp_path_factory.mktemp("alertmanager"), config_text, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def slurm_cluster(request, tmp_path_factory) -> SlurmCluster:
    """One real Slurm (+slurmdbd, MariaDB, munge, 8 fake GPUs) for the whole session.

    Tests share it: submit your own jobs, add prolog hooks with add_hook() and remove them after.
    """
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    request.addfinalizer(cluster.stop)
    return cluster


def _scheduling_scopes() -> dict[str, str]:
    """Test file -> the scope its tests are scheduled in: "slurm" for every file that uses the one real
    Slurm cluster (it starts once, on one worker), the file itself where it builds module fixtures
    (stores, demo histories: built once), nothing (each test on its own) for the rest. Read from the
    files' text because xdist's controller schedules node ids before any worker has collected."""
    scopes = {}
    for path in Path(__file__).parent.glob("test_*.py"):
        text = path.read_text()
        name = f"tests/{path.name}"
        if "slurm_cluster" in text:
            scopes[name] = "slurm"
        elif 'scope="module"' in text or 'scope="class"' in text:
            scopes[name] = name
    return scopes


def pytest_xdist_make_scheduler(config, log):
    """Parallel workers (pytest-xdist): tests go one by one to whichever worker is free, except those
    sharing a costly fixture, which go together (see _scheduling_scopes)."""
    from xdist.scheduler import LoadScopeScheduling

    scopes = _scheduling_scopes()

    class SharedFixtureScheduling(LoadScopeScheduling):
        started = False

        def _split_scope(self, nodeid: str) -> str:
            return scopes.get(nodeid.split("::", 1)[0], nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.started:  # the long ones first (the Slurm group, SLOW), so they do not trail the run
                self.started = True
                for scope in [s for s, ids in self.workqueue.items() if s == "slurm" or any(i.startswith(SLOW) for i in ids)]:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


# The quick tier (`./scripts/test -m quick`): every test but those that start a real component and
# those below, which take seconds each (a demo week, hypothesis over many stores, a wheel built and
# installed, Dask clusters, subprocess pipelines). Measured with --durations; the full run has them
# all, and starts them first.
SLOW = (
    # whole files: a demo week, stores checked against the raw oracle under hypothesis, CLI and
    # collector subprocesses, wheels built and installed, Dask clusters
    "tests/test_demo.py", "tests/test_demo_command.py", "tests/test_e2e_pipeline.py", "tests/test_packaging.py",
    "tests/test_analytics_ledger.py", "tests/test_analysis_facts.py", "tests/test_analytics_properties.py",
    "tests/test_analytics_jobs_cli.py", "tests/test_facts_dask.py", "tests/test_tasks.py",
    "tests/test_collector_real.py", "tests/test_collector_shards_real.py", "tests/test_collector_crash_real.py",
    # single tests of several seconds
    "tests/test_analytics_mfu.py::test_every_filtered_mfu_row_is_its_row_of_the_unfiltered_table",
    "tests/test_analytics_mfu.py::test_every_job_is_decided_as_the_row_by_row_rule_decides_it",
    "tests/test_analytics_job_timeline.py::test_job_timeline_matches_the_sql_definition",
    "tests/test_analytics_gputime.py::test_arrays_match_the_sql_definitions",
    "tests/test_dashboard_analytics.py::test_fleet_now_runs_follow_the_rules_sample_by_sample",
    "tests/test_report.py::test_recompute_command_runs_as_printed_and_gives_the_same_figures",
    "tests/test_report_email.py::test_scheduled_job_mails_fleet_and_team_reports_over_starttls",
    "tests/test_analytics_states.py::test_analyze_job_prints_and_emits_the_breakdown",
    "tests/test_reliability.py::test_each_attempt_classified_exactly_once",
    "tests/test_reliability.py::test_cli_reliability_json_and_table",
    "tests/test_store_segments.py::test_readers_see_the_full_snapshot_after_any_history",
    "tests/test_store_segments.py::test_segment_count_stays_logarithmic",
    "tests/test_facts.py::test_facts_give_the_raw_figures_at_every_grain_and_filter",
    "tests/test_facts.py::test_upkeep_run_twice_writes_no_new_byte",
    "tests/test_facts.py::test_late_data_rebuilds_exactly_its_hour_and_day",
    "tests/test_health_from_facts.py::test_health_from_facts_gives_the_raw_figures",
    "tests/test_health_from_facts.py::test_shards_health_gives_the_raw_figures",
    "tests/test_shard.py::test_the_shards_read_as_one_store_holding_every_batch",
    "tests/test_policy_actions.py::test_store_plan_acts_only_on_all_idle_jobs_with_the_samples_idle_time",
    "tests/test_dashboard_read.py", "tests/test_dashboard_browser.py",  # real components: listed to start first
    "tests/test_facts_upkeep.py::test_facts_are_a_fresh_builds_whatever_the_order_samples_land_and_upkeep_runs_in",
    "tests/test_health_from_facts.py::test_run_facts_rebuilt_after_late_data_are_a_fresh_build",
)
REAL_COMPONENT_FIXTURES = {"slurm_cluster", "prometheus_factory", "alertmanager_factory", "prometheus_bin", "promtool",
                           "alertmanager_bin", "amtool"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        real = item.get_closest_marker("realstack") is not None or REAL_COMPONENT_FIXTURES & set(item.fixturenames)
        if not real and not item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.quick)
