"""The [collector] section of the configuration file and its sub-tables, validated at start.

    [collector]
    store = "/var/lib/gpufleet/store"   # the store directory (one collector writes it)
    cluster = "default"
    listen = "127.0.0.1:9403"          # the collector's own /metrics; "" disables
    shard = ""                          # "K/N": one of N collectors sharing the store (gpufleet.collector.shard)
    accounting = true                   # sharded: the one shard that reads scheduler accounting (default: shard 1)

    [collector.scrape]                  # scrape exporters directly
    interval = 15
    targets = ["gpu-node-1:9400", "gpu-node-2:9402"]
    file_sd = ["/etc/gpufleet/targets/*.json"]

    [collector.prometheus]              # or read Prometheus / Thanos / Mimir / VictoriaMetrics
    url = "http://prometheus:9090"
    parallel_requests = 4               # queries in flight at once (default 1: one after the other)
    gpu_shards = 1                      # queries per chunk, each for a shard of the targets

    [collector.sacct]                   # Slurm accounting
    enabled = true
    format = "text"                     # or "json": sacct --json (Slurm 21.08+)

    [collector.slurmrestd]              # or Slurm's REST API (JWT), when sacct cannot be run
    url = "https://slurm-ctl:6820"      # or "unix:/run/slurmrestd/slurmrestd.socket"
    token_file = "/etc/gpufleet/slurm.jwt"

    [collector.slurm_json]              # or sacct --json / slurmrestd answers saved to files
    files = ["/var/spool/gpufleet/sacct-*.json"]

    [collector.kubernetes]              # pods requesting GPUs
    enabled = true

    [collector.retention]
    raw_days = 35
    facts_5m_days = 35                  # the facts' 5-minute grain
    facts_days = 400                    # the facts' hour and day grains

    [analytics]                         # read here too: the facts' parameters, and where rebuilds and backfills run
    idle_threshold_percent = 5.0
    dask_scheduler = "tcp://dask-scheduler:8786"   # "" (default): in the collector
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from gpufleet.config import ConfigError, Option, boolean, gather, host_port, integer, number, one_of, section, string, strings

TOP = (
    Option("store", "/var/lib/gpufleet/store", "a directory path", string),
    Option("cluster", "default", "a cluster name", string),
    Option("listen", "127.0.0.1:9403", 'HOST:PORT for the collector\'s /metrics, or ""', lambda v: v == "" or host_port(v)),
    Option("shard", "", 'K/N with 1 <= K <= N (one of N collectors sharing the store), or ""', lambda v: v == "" or _shard_spec(v)),
    Option("accounting", None, "true or false (sharded: whether this shard reads scheduler accounting)", boolean),
    Option("scrape", {}, "a table", lambda v: isinstance(v, dict)),
    Option("prometheus", {}, "a table", lambda v: isinstance(v, dict)),
    Option("sacct", {}, "a table", lambda v: isinstance(v, dict)),
    Option("slurmrestd", {}, "a table", lambda v: isinstance(v, dict)),
    Option("slurm_json", {}, "a table", lambda v: isinstance(v, dict)),
    Option("kubernetes", {}, "a table", lambda v: isinstance(v, dict)),
    Option("retention", {}, "a table", lambda v: isinstance(v, dict)),
)

SCRAPE = (
    Option("interval", 15.0, "a number of seconds > 0", number(0)),
    Option("timeout", 10.0, "a number of seconds > 0", number(0)),
    Option("targets", [], "a list of HOST:PORT or URL strings", strings),
    Option("file_sd", [], "a list of file paths or glob patterns", strings),
)

# [collector.prometheus]: queries in flight at once, and queries per chunk (one per GPU shard)
PARALLEL_REQUESTS = 1  # parallel reads cost client CPU (bench promread); worth it for a slow or remote store
GPU_SHARDS = 1
GPU_SHARDS_MAX = 36  # a target's shard is decided by one digit or letter of its host

PROMETHEUS = (
    Option("url", "", "an http(s) URL of a Prometheus-compatible API, or \"\"", string),
    Option("interval", 60.0, "a number of seconds > 0", number(0)),
    Option("chunk_seconds", 900, "an integer >= 60", integer(60)),
    Option("lag_seconds", 120, "an integer >= 0", integer(0)),
    Option("initial_lookback_seconds", 86400, "an integer >= 0", integer(0)),
    Option("selector", "", 'label matchers, e.g. cluster="a"', string),
    Option("timeout", 60.0, "a number of seconds > 0", number(0)),
    Option("parallel_requests", PARALLEL_REQUESTS, "an integer >= 1", integer(1)),
    Option("gpu_shards", GPU_SHARDS, f"an integer from 1 to {GPU_SHARDS_MAX}", lambda v: integer(1)(v) and v <= GPU_SHARDS_MAX),
)

SACCT = (
    Option("enabled", False, "true or false", boolean),
    Option("interval", 300.0, "a number of seconds > 0", number(0)),
    Option("command", "sacct", "the sacct executable", string),
    Option("overlap_seconds", 3600, "an integer >= 0", integer(0)),
    Option("initial_lookback_seconds", 7 * 86400, "an integer >= 0", integer(0)),
    Option("timezone", "UTC", "an IANA time zone name (sacct prints the cluster's local time)", string),
    Option("timeout", 120.0, "a number of seconds > 0", number(0)),
    Option("slurm_conf", "", "a slurm.conf path for SLURM_CONF, or \"\"", string),
    Option("format", "text", '"text" (sacct -P) or "json" (sacct --json)', one_of("text", "json")),
)

SLURMRESTD = (
    Option("url", "", 'an http(s) URL of slurmrestd, "unix:/path/to/socket", or ""', string),
    Option("interval", 300.0, "a number of seconds > 0", number(0)),
    Option("token_file", "", 'a file holding the JWT (re-read every run), or ""', string),
    Option("token_env", "", 'an environment variable holding the JWT, or ""', string),
    Option("user", "", 'the user name sent with the token (X-SLURM-USER-NAME), or ""', string),
    Option("api_version", "auto", '"auto" or a data_parser version such as "v0.0.40"',
           lambda v: isinstance(v, str) and (v == "auto" or re.fullmatch(r"v0\.0\.\d+", v) is not None)),
    Option("verify_tls", True, "true or false", boolean),
    Option("timeout", 60.0, "a number of seconds > 0", number(0)),
    Option("timezone", "UTC", "slurmrestd's IANA time zone (data_parser v0.0.37/38 read times in it)", string),
    Option("overlap_seconds", 3600, "an integer >= 0", integer(0)),
    Option("initial_lookback_seconds", 7 * 86400, "an integer >= 0", integer(0)),
)

SLURM_JSON = (
    Option("files", [], "a list of file paths or glob patterns", strings),
    Option("interval", 300.0, "a number of seconds > 0", number(0)),
)

KUBERNETES = (
    Option("enabled", False, "true or false", boolean),
    Option("interval", 60.0, "a number of seconds > 0", number(0)),
    Option("kubeconfig", "", 'a kubeconfig path, or "" for in-cluster config', string),
    Option("team_labels", ["team", "gpufleet.io/team"], "a list of pod label keys", strings),
)

RETENTION = (
    Option("raw_days", 35, "an integer >= 1", integer(1)),
    # facts (gpufleet.collector.facts): a day's 5-minute facts go whole once the day is older than
    # facts_5m_days (but not before its raw samples), its hour and day facts after facts_days (but
    # not before its 5-minute facts): maintenance.retire_facts
    Option("facts_5m_days", 35, "an integer >= 1 (days the 5-minute facts are kept)", integer(1)),
    Option("facts_days", 400, "an integer >= 1 (days the hour and day facts are kept)", integer(1)),
    Option("compact_interval", 600.0, "a number of seconds > 0 (compaction, facts and retention)", number(0)),
)


# [analytics] options the collector needs too: the facts its upkeep writes bake the first three in
# (gpufleet.collector.facts), and a rebuild of them runs on the Dask scheduler named here.
# Named here, below the analytics, which list them among their own (gpufleet.analytics.params).
ANALYTICS_SHARED = (
    Option("max_gap_seconds", 30.0, "a number of seconds > 0", number(0)),
    Option("idle_threshold_percent", 5.0, "a percentage from 0 to 100", lambda v: number(0, inclusive=True)(v) and v <= 100),
    Option("idle_min_duration_seconds", 1800.0, "a number of seconds >= 0", number(0, inclusive=True)),
    Option("dask_scheduler", "", 'a Dask scheduler address such as "tcp://host:8786", or "" (rebuilds and backfills run in the collector)',
           lambda v: v == "" or (isinstance(v, str) and re.fullmatch(r"(tcp|tls|ucx|inproc)://\S+", v) is not None)),
)


# [analytics] keys retired with the per-GPU summaries (issue #52), refused with what replaced them
RETIRED_ANALYTICS = {
    "summaries": "was retired with the per-GPU summaries (issue #52): every figure comes from the store's facts, "
                 "with the raw samples as the tests' oracle; remove it",
    "rebuild_gpu_shards": "was retired with the per-GPU summaries (issue #52): a facts rebuild runs a task per hour "
                          "(on dask_scheduler when set); remove it",
}


def refuse_retired_analytics(raw: Mapping[str, Any], path: Any) -> None:
    """A ConfigError naming the replacement of a retired [analytics] key `raw` (the section) holds."""
    for key, why in RETIRED_ANALYTICS.items():
        if key in raw:
            raise ConfigError(f"config {path} [analytics]: {key} {why}")


def analytics_shared(doc: Mapping[str, Any], path: Any) -> dict[str, Any]:
    """The ANALYTICS_SHARED options of [analytics] (its other keys are the analytics' to check)."""
    raw = doc.get("analytics", {})
    if not isinstance(raw, dict):
        return section(doc, "analytics", ANALYTICS_SHARED, path)  # says what is wrong with it
    refuse_retired_analytics(raw, path)
    names = {o.key for o in ANALYTICS_SHARED}
    return section({"analytics": {k: v for k, v in raw.items() if k in names}}, "analytics", ANALYTICS_SHARED, path)


def _shard_spec(v: Any) -> bool:
    from gpufleet.collector.shard import Shard, ShardError

    try:
        return isinstance(v, str) and Shard.parse(v) is not None
    except ShardError:
        return False


def load(doc: Mapping[str, Any], path: Any, *, shard: str | None = None) -> dict[str, Any]:
    """Validated collector options: top-level keys plus one dict per sub-table. `shard` (from
    the command line) replaces [collector] shard."""
    raw = doc.get("collector", {})
    raw = raw if isinstance(raw, dict) else {}  # section() below says what is wrong with it
    tables = (("scrape", SCRAPE), ("prometheus", PROMETHEUS), ("sacct", SACCT), ("slurmrestd", SLURMRESTD),
              ("slurm_json", SLURM_JSON), ("kubernetes", KUBERNETES), ("retention", RETENTION))
    retention = raw.get("retention")
    if isinstance(retention, dict) and "rollup_days" in retention:
        raise ConfigError(f"config {path} [collector.retention]: rollup_days was retired with the 5-minute rollups (issue #52: the "
                          "facts' 5-minute grain replaced them): remove it; job-reported throughput is kept for facts_days")
    if isinstance(retention, dict) and "summary_days" in retention:
        raise ConfigError(f"config {path} [collector.retention]: summary_days was retired with the per-GPU summaries (issue #52: the "
                          "facts replaced them): remove it; the 5-minute facts are kept for facts_5m_days, the hour and day facts "
                          "for facts_days")
    top, *validated = gather(lambda: section(doc, "collector", TOP, path),
                             *(lambda name=name, options=options: section(raw, name, options, path, parent="collector") for name, options in tables))
    top.update({name: opts for (name, _), opts in zip(tables, validated)})
    top["analytics"] = analytics_shared(doc, path)
    if shard is not None:
        if not _shard_spec(shard):
            raise ConfigError(f"--shard {shard!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
        top["shard"] = shard
    if top["prometheus"]["url"] and not top["prometheus"]["url"].startswith(("http://", "https://")):
        raise ConfigError(f"config {path} [collector.prometheus]: url = {top['prometheus']['url']!r}: expected an http:// or https:// URL")
    rest = top["slurmrestd"]
    if rest["url"] and not rest["url"].startswith(("http://", "https://", "unix:")):
        raise ConfigError(f"config {path} [collector.slurmrestd]: url = {rest['url']!r}: expected an http:// or https:// URL or unix:/path")
    if rest["token_file"] and rest["token_env"]:
        raise ConfigError(f"config {path} [collector.slurmrestd]: set token_file or token_env, not both")
    return top
