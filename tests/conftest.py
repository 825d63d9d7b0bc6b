"""Shared fixtures. Real components (Prometheus, Alertmanager, Slurm) come from tests/realstack/:
when one is unavailable a test skips with the reason, or fails under CI=true (realstack.policy)."""

from __future__ import annotations

import ast
import functools
import sys
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


@pytest.fixture(scope="session", autouse=True)
def streamlit_scans_installed_packages_once():
    """Streamlit's AppTest scans every installed package's metadata for components at each new
    AppTest's first run (~0.4 s of CPU, 307 packages); the packages do not change during a session,
    so a process scans once. (Only where the tests imported AppTest; a served dashboard scans at
    its start, as it always did.)"""
    if "streamlit.testing.v1" in sys.modules:
        from streamlit.components.v2 import manifest_scanner

        manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)
    yield


@pytest.fixture(autouse=True)
def no_streamlit_deprecation():
    """A page that calls Streamlit in a way it deprecated fails its test: Streamlit only logs it ("Please replace
    `use_container_width` with `width` ... will be removed after 2025-12-31") and the next release breaks the page."""
    import logging

    class Seen(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    seen = Seen()
    logger = logging.getLogger("streamlit.deprecation_util")
    logger.addHandler(seen)
    try:
        yield
    finally:
        logger.removeHandler(seen)
    assert not seen.messages, f"Streamlit deprecations: {seen.messages}"


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


SHARED_SCOPES = {"module", "class", "package"}


def _fixture_decorator(node: ast.FunctionDef) -> dict | None:
    """{"scope": ..., "autouse": ...} when the function is a pytest fixture, else None."""
    for d in node.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        target = call.func if call else d
        if isinstance(target, ast.Attribute) and target.attr == "fixture" or isinstance(target, ast.Name) and target.id == "fixture":
            kw = {k.arg: k.value.value for k in (call.keywords if call else []) if isinstance(k.value, ast.Constant)}
            return {"scope": kw.get("scope", "function"), "autouse": bool(kw.get("autouse"))}
    return None


def _arguments(node: ast.FunctionDef) -> list[str]:
    """The names a test or fixture asks for: its parameters and @pytest.mark.usefixtures' names."""
    names = [a.arg for a in node.args.args + node.args.kwonlyargs]
    for d in node.decorator_list:
        attr = d.func.attr if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) else getattr(getattr(d, "func", None), "id", None)
        if attr == "usefixtures":
            names += [a.value for a in d.args if isinstance(a, ast.Constant)]
        elif attr == "given":  # (hypothesis' arguments: the last ones, or named)
            names = [n for n in names[:len(names) - len(d.args)] if n not in {k.arg for k in d.keywords}]
    return names


def scheduling_groups(tests_dir: Path = Path(__file__).parent) -> dict[tuple[str, str], str]:
    """(test file, test function) -> the group its tests are scheduled in: "slurm" for a test that
    uses the one real Slurm cluster (it starts once, on one worker), the file for a test that uses
    a fixture the file builds once (module or class scope, also one imported from another test
    file: a store, the demo's week, a golden scenario); absent: on its own, whichever worker is
    free - also a test of such a file that uses none of them. Read from the files' source because
    xdist's controller schedules node ids before any worker has collected a fixture."""
    modules = {}
    for path in tests_dir.glob("test_*.py"):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:  # (its collection says so, on the workers)
            continue
        fixtures, imported, tests = {}, {}, {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_"):
                imported.update({a.asname or a.name: (node.module.split(".")[-1], a.name) for a in node.names})
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fixture = _fixture_decorator(node)
                if fixture:
                    fixtures[node.name] = dict(fixture, args=_arguments(node))
                elif node.name.startswith("test"):
                    tests[node.name] = _arguments(node)
        modules[path.stem] = (fixtures, imported, tests)

    def kind(module: str, name: str, seen: frozenset = frozenset()) -> str | None:
        """"slurm", "shared" (a module-scoped fixture on the way) or None for a fixture name as `module` sees it."""
        if name == "slurm_cluster":
            return "slurm"
        fixtures, imported, _ = modules.get(module, ({}, {}, {}))
        if name not in fixtures and name in imported and (module, name) not in seen:
            return kind(*imported[name], seen | {(module, name)})
        f = fixtures.get(name)
        if f is None or (module, name) in seen:
            return None
        found = {kind(module, a, seen | {(module, name)}) for a in f["args"]}
        return "slurm" if "slurm" in found else "shared" if f["scope"] in SHARED_SCOPES or "shared" in found else None

    groups = {}
    for module, (fixtures, _, tests) in modules.items():
        autouse = [n for n, f in fixtures.items() if f["autouse"]]
        for test, args in tests.items():
            found = {kind(module, a) for a in [*args, *autouse]}
            if found - {None}:
                groups[(f"tests/{module}.py", test)] = "slurm" if "slurm" in found else f"tests/{module}.py"
    return groups


def pytest_xdist_make_scheduler(config, log):
    """Parallel workers (pytest-xdist): tests go one by one to whichever worker is free, except those
    sharing a costly fixture, which go together (scheduling_groups)."""
    from xdist.scheduler import LoadScopeScheduling

    groups = scheduling_groups()

    class SharedFixtureScheduling(LoadScopeScheduling):
        started = False

        def _split_scope(self, nodeid: str) -> str:
            file, _, test = nodeid.partition("::")
            return groups.get((file, test.split("[", 1)[0].rsplit("::", 1)[-1]), nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.started:  # the long ones first, so they do not trail the run: the Slurm group, then
                # SLOW (most slow tests first), then the groups of several tests (the largest first)
                self.started = True
                weight = {s: (10**6 if s == "slurm" else 0) + 10**3 * sum(i.startswith(SLOW) for i in ids) + (len(ids) if len(ids) > 1 else 0)
                          for s, ids in self.workqueue.items()}
                for scope in sorted((s for s, n in weight.items() if n), key=weight.get):
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
    "tests/test_states_capture.py::test_the_script_runs_end_to_end_in_its_dry_run",
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
    # hypothesis over stores, 20-160 s each (the quick tier's long poles at stop 61)
    "tests/test_job_gpus.py::test_rows_of_unknown_gpu_counts_are_unknown_and_the_known_part_adds_up",
    "tests/test_analytics_attempts.py::test_allocated_is_the_sum_over_attempts_and_teams_sum_to_the_fleet",
    "tests/test_analytics_attempts.py::test_a_requeued_jobs_figures_from_the_facts_equal_the_raw_path",  # (~18 s, stop 90)
    "tests/test_facts_health.py::test_facts_give_the_health_and_mfu_paths_figures",
    "tests/test_facts_health.py::test_joining_parts_with_health_columns_in_any_grouping_gives_the_same_parts",
    "tests/test_facts.py::test_joining_parts_in_any_grouping_gives_the_same_parts",
    "tests/test_facts.py::test_parts_cut_at_extra_edges_are_the_parts_of_each_span_alone",
    "tests/test_goodput.py::test_waterfall_invariants",
    "tests/test_health_from_facts.py::test_run_facts_rebuilt_after_late_data_are_a_fresh_build",
    # the quick tier's longest at stop 63 (12, 9, 6, 5.5 and 5 s of CPU)
    "tests/test_window_states.py::test_states_partition_each_jobs_time_and_teams_sum_to_the_fleet",
    "tests/test_gpu_shares.py::test_the_shares_of_one_gpu_never_exceed_1_and_unknown_stays_unknown",
    "tests/test_analytics_states.py::test_a_stored_job_breaks_down_as_its_samples_do",
    "tests/test_facts_retention.py::test_retention_retires_whole_days_of_each_grain_and_upkeep_leaves_them_retired",
    "tests/test_job_gpus.py::test_the_stored_gpu_count_is_the_most_authoritative_seen_in_any_order",
    "tests/test_dashboard_analytics.py::test_last_xid_is_the_newest_code_of_the_forget_window_from_facts_or_samples",
    # ... and at stop 64 (5-9 s of CPU each)
    "tests/test_store.py::test_fast_lane_and_full_upsert_agree_on_random_observations",
    "tests/test_raw_reads.py::test_analyze_under_every_filter",
    "tests/test_queue_gaps.py::test_the_gap_is_the_rule_hour_by_hour_never_above_the_free_capacity_and_oversized_jobs_never_count",
    "tests/test_facts_rebuild.py::test_a_store_without_facts_gets_upkeeps_facts_byte_for_byte",
    "tests/test_raw_reads.py::test_a_window_edge_whose_samples_retention_retired_is_said_on_every_window_page",
    "tests/test_raw_reads.py::test_every_page_reads_no_raw_sample_beyond_the_edges",
    "tests/test_policy_rules.py::test_invariants",
    "tests/test_job_gpus.py::test_slurmrestd_without_gpu_tres_is_said_and_filled_from_slurmctld",
    # ... and at stop 65: a store written and read twice for each of 25 histories (~10 s of CPU), and
    # 300 histories linked twice (~8 s)
    "tests/test_reliability.py::test_the_store_lists_the_attempts_chain_candidates_names",
    "tests/test_reliability.py::test_the_candidates_link_the_broken_chains_as_linking_all_does",
)
REAL_COMPONENT_FIXTURES = {"slurm_cluster", "prometheus_factory", "alertmanager_factory", "prometheus_bin", "promtool",
                           "alertmanager_bin", "amtool"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        real = item.get_closest_marker("realstack") is not None or REAL_COMPONENT_FIXTURES & set(item.fixturenames)
        if not real and not item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.quick)
