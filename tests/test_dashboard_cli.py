"""`gpufleet dashboard` (dashboards/cli.py): options, configuration errors, the secrets file for
sign-in, and a real start and stop of the Streamlit server."""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpufleet.dashboards import cli
from gpufleet.dashboards import config as dconfig
from gpufleet.config import ConfigError
from tests.realstack.process import free_port, wait_for
from tests.support.dashboard import dashboard_healthy


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"config": None, "listen": None, "store": None, **kw})


def test_bad_configuration_exits_2(tmp_path, caplog):
    cfg = tmp_path / "g.toml"
    for text, message in (
        ('[dashboard]\nrefresh_seconds = -1\n', "refresh_seconds = -1: expected an integer number of seconds >= 0"),
        ('[dashboard]\ndefault_window = "2w"\n', "default_window = '2w': expected one of 1h, 6h, 24h, 7d, 30d"),
        ('[dashboard]\nlisten = "nowhere"\n', "listen = 'nowhere': expected HOST:PORT"),
        ('[dashboard]\ncolour = "blue"\n', "unknown key 'colour'"),
        ('[dashboard]\nbase_url_path = "a b"\n', "base_url_path = 'a b'"),
        ('[dashboard.auth]\nredirect_uri = "https://x.example.org/"\ncookie_secret = "s"\n', "expected the dashboard's URL ending in /oauth2callback"),
        ('[dashboard.auth]\nredirect_uri = "https://x.example.org/oauth2callback"\ncookie_secret = "s"\n', "client_id = None: expected a non-empty string"),
        ('[analytics]\nidle_threshold_percent = 500\n', "idle_threshold_percent = 500"),
    ):
        cfg.write_text(text)
        caplog.clear()
        assert cli.run(args(config=str(cfg), store=str(tmp_path)), io.StringIO()) == 2
        assert message in caplog.text, (text, caplog.text)
    assert cli.run(args(listen="8501", store=str(tmp_path)), io.StringIO()) == 2
    assert cli.run(args(config=str(tmp_path / "missing.toml")), io.StringIO()) == 2


def test_store_resolution(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text('[collector]\nstore = "/from/collector"\n')
    assert dconfig.resolve(str(cfg), None).store == Path("/from/collector")
    cfg.write_text('[collector]\nstore = "/from/collector"\n[analytics]\nstore = "/from/analytics"\n')
    assert dconfig.resolve(str(cfg), None).store == Path("/from/analytics")
    cfg.write_text('[analytics]\nstore = "/from/analytics"\n[dashboard]\nstore = "/from/dashboard"\n')
    assert dconfig.resolve(str(cfg), None).store == Path("/from/dashboard")
    assert dconfig.resolve(str(cfg), "/flag").store == Path("/flag")


def test_fairness_options_share_the_analytics_section(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text('[analytics]\nidle_threshold_percent = 7\nhalf_life_days = 3\n[analytics.shares]\nphysics = 2\nbiology = 1\n')
    s = dconfig.resolve(str(cfg), str(tmp_path))
    assert s.shares == {"physics": 2.0, "biology": 1.0} and s.half_life.days == 3
    # the one [analytics] section, fairness keys included, is what the figures are computed from
    from datetime import datetime

    from gpufleet.analytics.params import from_config

    assert from_config(s.doc, s.config_path, datetime(2026, 1, 1), datetime(2026, 1, 2)).idle_threshold == 7.0
    cfg.write_text('[analytics]\nshares = "all"\n')
    with pytest.raises(ConfigError, match="shares"):
        dconfig.resolve(str(cfg), str(tmp_path))


def test_secrets_file_is_streamlits_auth_section():
    auth = {"redirect_uri": "https://g.example.org/oauth2callback", "cookie_secret": 'q"uo\\te', "expose_tokens": ["id"],
            "client_kwargs": {"prompt": "login"}, "client_id": "c", "client_secret": "s", "server_metadata_url": "https://id/x"}
    assert tomllib.loads(cli.secrets_toml(auth)) == {"auth": auth}
    named = {"redirect_uri": "https://g/oauth2callback", "cookie_secret": "x", "google": {"client_id": "a", "client_secret": "b",
             "server_metadata_url": "https://accounts.google.com/.well-known/openid-configuration"}}
    assert tomllib.loads(cli.secrets_toml(named)) == {"auth": named}


def test_command_line_of_streamlit(tmp_path):
    argv = cli.command("127.0.0.1", 8600, "cfg.toml", str(tmp_path), None)
    assert argv[:4] == [sys.executable, "-m", "gpufleet.dashboards.serve", "run"] and argv[4].endswith("dashboards/app.py")
    for flag, value in (("--server.address", "127.0.0.1"), ("--server.port", "8600"), ("--server.headless", "true"),
                        ("--browser.gatherUsageStats", "false")):
        assert argv[argv.index(flag) + 1] == value
    assert argv[argv.index("--") + 1:] == ["--served", "--config", str(Path("cfg.toml").resolve()), "--store", str(tmp_path.resolve())]
    assert "--secrets.files" in cli.command("0.0.0.0", 1, None, None, tmp_path / "s.toml")
    proxied = cli.command("127.0.0.1", 1, None, None, None, "/gpufleet/")
    assert proxied[proxied.index("--server.baseUrlPath") + 1] == "gpufleet"


def test_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.dashboards.cli", "--store", str(tmp_path), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"gpufleet dashboard: serving at http://127.0.0.1:{port}/"), first
        wait_for("the dashboard", lambda: dashboard_healthy(port) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, "the dashboard exited before it served"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_server_imports_what_the_pages_import_before_it_listens(tmp_path):
    """serve.py's preload: every module a page's source imports, read from the sources (a page's
    new import is found without a list), names that are not modules skipped, a module that fails
    on an import of its own not hidden."""
    from gpufleet.dashboards import serve

    names = serve.page_imports()
    assert {"polars", "altair", "duckdb", "gpufleet.analytics.core", "gpufleet.analytics.fleet_now", "gpufleet.dashboards.data"} <= set(names)
    assert "gpufleet.analytics.core.Analysis" in names  # (a `from X import name`: tried, then skipped)
    loaded = serve.preload(["json", "gpufleet.analytics.core.Analysis", "gpufleet.times"])
    assert loaded == ["json", "gpufleet.times"]
    (tmp_path / "views").mkdir()
    (tmp_path / "app.py").write_text("import json\nfrom gpufleet.times import utcnow\n")
    (tmp_path / "views" / "p.py").write_text("def f():\n    from email import message\n")
    assert serve.page_imports(tmp_path) == ["email", "email.message", "gpufleet.times", "gpufleet.times.utcnow", "json"]
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
            serve.preload(["broken"])
    finally:
        sys.path.remove(str(tmp_path))


def test_server_skips_streamlits_check_for_a_script_run_without_it():
    """serve.py marks Streamlit's once-a-process check for `python app.py` done (its inspect.stack()
    cost the first page ~0.2 s): if a Streamlit release renames or reshapes it, this fails rather
    than the saving going silently."""
    code = ("from streamlit import delta_generator, env_util\n"
            "from gpufleet.dashboards import serve\n"
            "def walked():\n    raise AssertionError('Streamlit still walks the stack: is_repl() called')\n"
            "env_util.is_repl = walked\n"
            "assert serve.skip_direct_run_check()\n"
            "delta_generator._maybe_print_use_warning()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
