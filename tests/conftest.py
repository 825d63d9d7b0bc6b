"""Shared fixtures. Real components (Prometheus, Alertmanager, Slurm) come from tests/realstack/:
when one is unavailable a test skips with the reason, or fails under CI=true (realstack.policy)."""

from __future__ import annotations

import os

import pytest

from tests.realstack import prometheus as prom
from tests.realstack.policy import unavailable
from tests.realstack.slurm import SlurmCluster, start_slurm
from tests.support.shared_data import ABSENT_REASON, is_absent_shared_file


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test that opens a file of ../shared/data where the folder is absent skips with one line
    (fails under CI=true), instead of erroring with a traceback."""
    try:
        return (yield)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is the absent folder
        if is_absent_shared_file(error):
            unavailable(ABSENT_REASON)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The same for a fixture that reads ../shared/data."""
    try:
        return (yield)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is the absent folder
        if is_absent_shared_file(error):
            unavailable(ABSENT_REASON)
        raise


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


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory):
    """What the product caches under $XDG_CACHE_HOME (the dashboards' hour facts) goes to the
    session's temporary directory, never to the home directory of whoever runs the tests."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old
