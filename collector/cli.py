"""`gpufleet collect`: the long-running service, a single pass (--once), or a backfill."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, Mapping, Sequence

from gpufleet.config import ConfigError, gather, load_config
from gpufleet.procs import stop_on_signals
from gpufleet.times import parse_time

log = logging.getLogger(__name__)

# (config document, config path) -> a callable add(scheduler, collector) that adds a job to the
# APScheduler (the collector: its writer and metrics, for jobs that record), or None
ScheduledJob = Callable[[Mapping[str, Any], Any], "Callable[[Any, Any], Any] | None"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([collector] section)")
    p.add_argument("--shard", metavar="K/N", help="be shard K of N collectors sharing the store (overrides [collector] shard)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run every source once and exit")
    mode.add_argument("--backfill", nargs=2, metavar=("START", "END"), help="fill a past window (ISO 8601 times, UTC unless an offset is given); a Prometheus "
                           "API source's chunks are read on [analytics] dask_scheduler if set")
    mode.add_argument("--rebuild-summaries", action="store_true", help=argparse.SUPPRESS)  # retired: refused with the replacement
    mode.add_argument("--rebuild-facts", nargs="*", metavar="TIME",
                      help="build again from the raw samples the facts (the derived tier) of the hours and days overlapping START END "
                           "(two TIMEs, ISO 8601, UTC unless an offset is given; none: the whole store), and exit")


def build(opts: dict[str, Any]):
    """Writer, collector and scheduled sources from validated options."""
    from gpufleet.collector.config import GPU_SHARDS_MAX
    from gpufleet.collector.service import Collector, ScheduledSource
    from gpufleet.collector.shard import Shard, ShardError, claim_accounting
    from gpufleet.collector.store import StoreWriter

    shard = Shard.parse(opts["shard"]) if opts["shard"] else None
    accounting = opts["accounting"] if opts["accounting"] is not None else (shard is None or shard.index == 1)
    sources, accounting_sources = [], []
    sc = opts["scrape"]
    if sc["targets"] or sc["file_sd"]:
        from gpufleet.collector.sources.scrape import ScrapeSource

        sources.append(ScheduledSource(ScrapeSource(cluster=opts["cluster"], static_targets=sc["targets"], file_sd=sc["file_sd"],
                                                    timeout=sc["timeout"], shard=shard), sc["interval"]))
    pr = opts["prometheus"]
    if pr["url"] and shard is not None and shard.count > GPU_SHARDS_MAX:
        raise ConfigError(f"[collector] shard = {opts['shard']!r} with [collector.prometheus] url: at most {GPU_SHARDS_MAX} shards "
                          "read one Prometheus API (a target's shard is one digit or letter of its host)")
    if pr["url"]:
        from gpufleet.collector.sources.prometheus_api import PrometheusApiSource

        src = PrometheusApiSource(
            url=pr["url"], cluster=opts["cluster"], chunk_seconds=pr["chunk_seconds"], lag_seconds=pr["lag_seconds"],
            initial_lookback_seconds=pr["initial_lookback_seconds"], timeout=pr["timeout"], selector=pr["selector"],
            parallel_requests=pr["parallel_requests"], gpu_shards=pr["gpu_shards"],
            part=(shard.index - 1, shard.count) if shard is not None else None,
        )
        sources.append(ScheduledSource(src, pr["interval"]))
    sa = opts["sacct"]
    if sa["enabled"]:
        from gpufleet.collector.sources.slurm import SacctSource

        accounting_sources.append(ScheduledSource(SacctSource.from_options(opts["cluster"], sa), sa["interval"]))
    rest = opts["slurmrestd"]
    if rest["url"]:
        from gpufleet.collector.sources.slurmrestd import SlurmrestdSource

        accounting_sources.append(ScheduledSource(SlurmrestdSource.from_options(opts["cluster"], rest), rest["interval"]))
    sj = opts["slurm_json"]
    if sj["files"]:
        from gpufleet.collector.sources.slurm_files import SlurmJsonFilesSource

        accounting_sources.append(ScheduledSource(SlurmJsonFilesSource(cluster=opts["cluster"], files=sj["files"]), sj["interval"]))
    k8s = opts["kubernetes"]
    if k8s["enabled"]:
        from gpufleet.collector.sources.kubernetes import KubernetesSource

        accounting_sources.append(ScheduledSource(KubernetesSource.from_options(opts["cluster"], k8s), k8s["interval"]))
    if accounting:
        sources += accounting_sources
    elif accounting_sources:
        log.info("shard %s: the scheduler accounting (%s) is read by the accounting shard, not here", shard.name,
                 ", ".join(s.source.name for s in accounting_sources))
    if not sources:
        raise ConfigError("[collector]: no source configured: set scrape targets, prometheus.url, sacct.enabled, slurmrestd.url, "
                          "slurm_json.files or kubernetes.enabled")
    from gpufleet.collector.facts import FactParams
    from gpufleet.collector.tasks import TaskRunner

    an = opts["analytics"]
    try:
        params = FactParams(max_gap_s=float(an["max_gap_seconds"]), idle_threshold=float(an["idle_threshold_percent"]),
                            idle_min_s=float(an["idle_min_duration_seconds"]))
    except ValueError as e:
        raise ConfigError(f"[analytics]: {e}") from None
    upkeep = dict(fact_params=params, tasks=TaskRunner(scheduler=an["dask_scheduler"], name="facts"))
    root = opts["store"]
    if shard is not None:
        if accounting:
            try:
                claim_accounting(root, shard)
            except ShardError as e:
                raise ConfigError(str(e)) from None
        root = shard.root(root)
    return Collector(StoreWriter(root), sources, shard=shard, accounting=accounting, **upkeep)


def _span(flag: str, texts: list[str] | None) -> list | None:
    """A START END pair of a flag as times (None: not given or empty); START must be before END."""
    if not texts:
        return None
    span = [parse_time(t) for t in texts]
    if span[0] >= span[1]:
        raise ConfigError(f"{flag} {texts[0]} {texts[1]}: START must be before END")
    return span


def _rebuild_facts(collector, span, out) -> int:
    """--rebuild-facts; 1 when it fails (what failed is logged)."""
    from gpufleet.collector.store import StoreError

    where = "the whole store" if span is None else f"{span[0].isoformat()} to {span[1].isoformat()}"
    out.write(f"rebuilding the facts of {where} in {collector.writer.root}\n")
    out.flush()
    try:
        built = collector.rebuild_facts(None if span is None else tuple(span))
    except (StoreError, OSError) as e:
        log.error("rebuilding the facts of %s failed: %s (run it again: the hours written are kept)", collector.writer.root, e)
        return 1
    finally:
        collector.writer.close()
    out.write(f"facts: {built['hours']} hours of 5-minute facts and {built['days']} days of hour and day facts built\n")
    return 0


def run(args: argparse.Namespace, out=None, scheduled_jobs: Sequence[ScheduledJob] = ()) -> int:
    """`scheduled_jobs`: each is given the config document and path at start (so it can reject a bad
    section then) and returns a callable that adds its job to the service's scheduler, or None.
    The shell passes the weekly report's here: the collector imports nothing above itself."""
    from gpufleet.collector import config
    from gpufleet.collector.store import StoreError

    try:
        if args.rebuild_summaries:
            raise ConfigError("--rebuild-summaries was retired with the per-GPU summaries (issue #52: the facts are the store's one "
                              "derived tier): use --rebuild-facts [START END], which builds the facts again from the raw samples")
        doc = load_config(args.config)
        window = _span("--backfill", args.backfill)
        rebuild_facts = args.rebuild_facts
        if rebuild_facts is not None and len(rebuild_facts) not in (0, 2):
            raise ConfigError(f"--rebuild-facts {' '.join(rebuild_facts)}: expected START END, or nothing (the whole store)")
        facts_span = _span("--rebuild-facts", rebuild_facts)
        service = not (args.once or window or rebuild_facts is not None)
        opts, extra_jobs = gather(lambda: config.load(doc, args.config, shard=args.shard),
                                  lambda: [add for make in scheduled_jobs if (add := make(doc, args.config))] if service else [])
        collector = build(opts)
        if extra_jobs and not collector.accounting:
            log.info("shard %s: the weekly report and the idle-GPU policy run in the accounting shard", collector.shard.name)
            extra_jobs = []
    except ConfigError as e:
        log.error("%s", e)
        return 2
    except StoreError as e:
        log.error("%s", e)
        return 1
    if rebuild_facts is not None:
        return _rebuild_facts(collector, facts_span, out or sys.stderr)
    if args.once or window:
        # an empty result reporting success is a defect: fail when nothing at all was recognized
        collector.reset_recognized()
        if args.once:
            ok = collector.run_once()
        else:
            from gpufleet.collector.backfill import backfill

            ok = backfill(collector, *window, out=out or sys.stderr)
        collector.writer.close()
        why = collector.nothing_recognized()
        if why:
            log.error("%s", why)
        return 0 if ok and not why else 1
    stop = stop_on_signals()
    if opts["listen"]:
        from prometheus_client import start_http_server

        host, _, port = opts["listen"].rpartition(":")
        server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=collector.metrics.registry)
        if out is not None:
            out.write(f"gpufleet collect: metrics at http://{host or '0.0.0.0'}:{server.server_port}/metrics, store {opts['store']}\n")
            out.flush()
    ret = opts["retention"]
    collector.serve(stop, maintenance_interval=ret["compact_interval"], raw_days=ret["raw_days"],
                    facts_5m_days=ret["facts_5m_days"], facts_days=ret["facts_days"], extra_jobs=extra_jobs)
    return 0
