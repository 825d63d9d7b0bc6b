"""The [dashboard] section of the configuration file, and what the app needs from the others.

    [dashboard]
    listen = "127.0.0.1:8501"        # HOST:PORT Streamlit serves on
    base_url_path = ""               # serve under /<path>/, e.g. "gpufleet" behind a proxy
    store = ""                       # default: [analytics] store, else [collector] store
    refresh_seconds = 60             # auto-refresh when the store has news; 0 turns it off
    default_window = "24h"           # 1h, 6h, 24h, 7d or 30d
    stale_after_seconds = 300        # a GPU's latest sample older than this is "no data"
    memory_limit = ""                # DuckDB memory limit of the dashboard's reader, e.g. "4GB" ("": DuckDB's 80 % of RAM)
    threads = 0                      # DuckDB threads (0: one per core)
    allowed_emails = []              # with [dashboard.auth]: who may see it ([] = anyone who signs in)
    allowed_domains = []             #   ... or whose e-mail is in one of these domains

    [dashboard.auth]                 # optional: Streamlit's built-in OIDC sign-in (st.login)
    redirect_uri = "https://gpufleet.example.org/oauth2callback"
    cookie_secret = "a long random string"
    client_id = "..."
    client_secret = "..."
    server_metadata_url = "https://accounts.example.org/.well-known/openid-configuration"

The [dashboard.auth] table is exactly Streamlit's [auth] secrets section (named providers as
sub-tables work too); `gpufleet dashboard` hands it to Streamlit in a private secrets file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpufleet.config import ConfigError, Option, gather, host_port, integer, load_config, one_of, section, strings

WINDOWS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
AUTH_REQUIRED = ("redirect_uri", "cookie_secret")
AUTH_PROVIDER = ("client_id", "client_secret", "server_metadata_url")

OPTIONS = (
    Option("listen", "127.0.0.1:8501", "HOST:PORT", host_port),
    Option("base_url_path", "", 'a URL path like "gpufleet", or ""', lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._~/-]*", v) is not None),
    Option("store", "", "a store directory path, or \"\" for [analytics] store, else [collector] store", lambda v: isinstance(v, str)),
    Option("refresh_seconds", 60, "an integer number of seconds >= 0 (0: no auto-refresh)", integer(0)),
    Option("default_window", "24h", f"one of {', '.join(WINDOWS)}", one_of(*WINDOWS)),
    Option("stale_after_seconds", 300, "an integer number of seconds >= 1", integer(1)),
    Option("memory_limit", "", 'a DuckDB size like "4GB", or "" for DuckDB\'s default',
           lambda v: isinstance(v, str) and (v == "" or re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", v) is not None)),
    Option("threads", 0, "an integer >= 0 (0: one per core)", integer(0)),
    Option("allowed_emails", [], "a list of e-mail addresses", strings),
    Option("allowed_domains", [], "a list of e-mail domains, e.g. [\"example.org\"]", strings),
    Option("auth", {}, "a table of Streamlit [auth] settings (redirect_uri, cookie_secret, client_id, ...)", lambda v: isinstance(v, dict)),
)

ENV_CONFIG = "GPUFLEET_CONFIG"
ENV_STORE = "GPUFLEET_DASHBOARD_STORE"


def check_auth(auth: Mapping[str, Any], path: Any) -> None:
    """The [dashboard.auth] table has what st.login needs: shared keys and one provider's keys
    (at top level, or in named sub-tables)."""
    if not auth:
        return
    where = f"config {path or '(defaults)'} [dashboard.auth]"
    for key in AUTH_REQUIRED:
        if not isinstance(auth.get(key), str) or not auth.get(key):
            raise ConfigError(f"{where}: {key} = {auth.get(key)!r}: expected a non-empty string")
    if not str(auth["redirect_uri"]).endswith("/oauth2callback"):
        raise ConfigError(f"{where}: redirect_uri = {auth['redirect_uri']!r}: expected the dashboard's URL ending in /oauth2callback")
    providers = {k: v for k, v in auth.items() if isinstance(v, dict)}
    blocks = providers.values() if providers else [auth]
    for block in blocks:
        for key in AUTH_PROVIDER:
            if not isinstance(block.get(key), str) or not block.get(key):
                raise ConfigError(f"{where}: {key} = {block.get(key)!r}: expected a non-empty string")


def load(doc: Mapping[str, Any], path: Any) -> dict[str, Any]:
    opts = section(doc, "dashboard", OPTIONS, path)
    check_auth(opts["auth"], path)
    return opts


@dataclass(frozen=True)
class Settings:
    """Everything the app reads at start: validated once, then shared by every session."""

    config_path: str | None
    store: Path
    doc: dict = field(repr=False)  # the whole file
    dashboard: dict = field(repr=False)
    shares: dict[str, float] | None = None
    half_life: timedelta = timedelta(days=7)

    @property
    def fingerprint(self) -> str:
        """Changes when anything that changes a figure changes: part of every cache key."""
        blob = json.dumps({"doc": self.doc, "store": str(self.store), "shares": self.shares, "hl": self.half_life.total_seconds()},
                          sort_keys=True, default=str)
        return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()

    @property
    def refresh_seconds(self) -> int:
        return int(self.dashboard["refresh_seconds"])

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.dashboard["stale_after_seconds"])

    @property
    def auth_enabled(self) -> bool:
        return bool(self.dashboard["auth"])


def resolve(config_path: str | None, store: str | None) -> Settings:
    from gpufleet.analytics import params
    from gpufleet.analytics.fairness import settings as fairness_settings

    doc = load_config(config_path)
    dash, opts = gather(lambda: load(doc, config_path), lambda: params.analytics_options(doc, config_path))
    shares, half_life = fairness_settings(opts)
    root = params.store_path(doc, config_path, store, dash["store"])
    return Settings(config_path=config_path, store=root, doc=doc, dashboard=dash, shares=shares, half_life=half_life)


def app_arguments(argv: Sequence[str] | None = None) -> tuple[str | None, str | None]:
    """(--config, --store) from the app's command line (`streamlit run app.py -- --store S`),
    else from $GPUFLEET_CONFIG / $GPUFLEET_DASHBOARD_STORE."""
    import argparse

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--config")
    p.add_argument("--store")
    args, _ = p.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    return args.config or os.environ.get(ENV_CONFIG) or None, args.store or os.environ.get(ENV_STORE) or None


def served(argv: Sequence[str] | None = None) -> bool:
    """Whether the app was started to serve (`gpufleet dashboard` passes --served): only then
    does it write gpufleet's log lines to stderr (ui.log_to_stderr)."""
    return "--served" in (sys.argv[1:] if argv is None else argv)
