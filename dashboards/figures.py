"""The figures of a window, as the Utilization, Jobs, Teams, Waste and MFU pages get them
(`for_window`) and the Health page its GPU health (`health_for`): the presets' computed before
anyone asks for them, the rest when asked.

A relative window's figures ("the last 7 days" for the whole fleet: what operators and managers
open first) cost one window analysis - a second at 1,000 GPUs, about 20 s at 16,000 - and are
reused for a period (data.step_for: 5 minutes for 24 h, 30 for 7 days). One thread per dashboard
process - started at the served app's first script run - computes the `[dashboard] warm_windows`
presets' figures at the start of each period,
into the cache the pages read (data.window_bundle, the previous window's totals the Waste page
compares with, and the window's GPU health: data.health_for), so a page's first load of a preset
finds them (Fleet now's states, and Health's "now" figures, follow now and stay computed when
asked: ~1-2 s at 16,000 GPUs). While a period's figures
are being computed, a page is served the previous period's - its caption names the window they
are for - instead of waiting. A preset with filters, a preset not warmed and a window typed in
are computed when asked, as before. The warmer's thread, and the one that computes a typed
window's figures ahead for its other pages (_prefetch), work at the lowest CPU priority on a
reader of their own (data.work_ahead): a page opened meanwhile has the cores first.

The cost is one analysis per warmed preset per period, asked or not: at 16,000 GPUs about 20 s
of a core every 30 minutes for 7 days (~1.1 %).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Sequence

import streamlit as st

from gpufleet.analytics.params import Filters
from gpufleet.collector.store import StoreError
from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards import data
from gpufleet.times import utcnow

log = logging.getLogger(__name__)
THREAD = "gpufleet-warm"
FACTS = "hour facts"  # the warmer's status row of the hour facts (dashboards/facts.py)
FACTS_PERIOD = timedelta(minutes=5)  # how often the warmer looks for hours without facts when it warms no preset
# Streamlit warns of every cached call made outside a page's script run ("missing
# ScriptRunContext! This warning can be ignored when running in bare mode"): the warmer's calls
# are meant so, and are not logged
_STREAMLIT_CONTEXT_LOG = "streamlit.runtime.scriptrunner_utils.script_run_context"


@dataclass(frozen=True)
class _Done:
    epoch: int
    bundle: data.Bundle
    health: dict | None  # None: its computation failed (the pages compute it when asked)


class Warmer:
    """Computes the presets' figures once per reuse period (`warm`), and hands them to pages
    (`serve`). `clock` is the moment a period is numbered by (data.make_window)."""

    def __init__(self, presets: Sequence[str], clock: Callable[[], datetime] = utcnow):
        unknown = [p for p in presets if p not in dconfig.WINDOWS]
        if unknown:
            raise ValueError(f"warm windows {unknown}: expected some of {', '.join(dconfig.WINDOWS)}")
        self.presets = tuple(dict.fromkeys(presets))
        self.clock = clock
        self.errors: dict[str, str] = {}  # preset -> why its last pass failed
        self.computed: dict[str, dict] = {}  # preset -> its last computation: when, how long, for which window
        self._done: dict[tuple, _Done] = {}  # (store, fingerprint, preset) -> the newest figures
        self._busy: set[tuple] = set()
        self._lock = threading.Lock()

    def warm(self, s: dconfig.Settings) -> list[str]:
        """One pass: every preset whose current period has no figures yet gets them. Returns
        the presets computed; a failing one is logged and kept in `errors`, the others go on."""
        this_pass = []
        for preset in self.presets:
            w = data.make_window(s, preset=preset, start=None, end=None, filters=Filters(), now=self.clock())
            key = (w.root, w.fingerprint, preset)
            with self._lock:
                done = self._done.get(key)
                if done is not None and done.epoch == w.epoch:
                    continue
                self._busy.add(key)
            t0 = time.monotonic()
            health, health_error = None, None
            try:
                bundle = data.window_bundle(w.key)
                data.previous_baseline(bundle.window.key)
                try:  # (the Health page's figures: their failure leaves the other pages' figures warmed)
                    health = data.health_for(w)
                except Exception as e:  # noqa: BLE001
                    log.exception("computing the %s window's GPU health ahead failed", preset)
                    health_error = f"GPU health: {type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - a bad file, no store yet: the pages say it when asked
                if isinstance(e, StoreError):  # no store yet (the collector has not published): one line
                    log.warning("the %s window's figures not computed ahead: %s", preset, e)
                else:
                    log.exception("computing the %s window's figures ahead failed", preset)
                self.errors[preset] = f"{type(e).__name__}: {e}"
                continue
            finally:
                with self._lock:
                    self._busy.discard(key)
            with self._lock:
                self._done[key] = _Done(w.epoch, bundle, health)
            if health_error:
                self.errors[preset] = health_error
            else:
                self.errors.pop(preset, None)
            this_pass.append(preset)
            took = time.monotonic() - t0
            self.computed[preset] = {"computed_at": utcnow(), "took_s": took, "start": bundle.window.start, "end": bundle.window.end}
            log.info("the %s window's figures computed ahead in %.1f s (%s to %s)", preset, took, bundle.window.start, bundle.window.end)
        self.refresh_facts(s)
        return this_pass

    def refresh_facts(self, s: dconfig.Settings):
        """Build the hour facts the closed hours of the last `[dashboard] facts_days` days lack
        (dashboards/facts.py), after the presets: what it did (facts.Refreshed), None when no facts
        are kept or the pass failed (logged, and kept in `errors`)."""
        from gpufleet.dashboards import facts

        where = data.facts_dir(s)
        if where is None:
            return None
        now = self.clock()
        try:
            p = data.params_for(s, *facts.horizon(now, s.dashboard["facts_days"]), Filters())
            done = facts.refresh(data.reader(s.store), where, p, now)
        except Exception as e:  # noqa: BLE001 - no store yet, a bad file: the pages compute their windows meanwhile
            if isinstance(e, StoreError):
                log.warning("hour facts not built: %s", e)
            else:
                log.exception("building the hour facts failed")
            self.errors[FACTS] = f"{type(e).__name__}: {e}"
            return None
        self.errors.pop(FACTS, None)
        if done.hours_built or done.days_rolled:
            self.computed[FACTS] = {"computed_at": utcnow(), "took_s": done.took_s, "start": p.start, "end": p.end}
            log.info("hour facts of %d hours built and %d days rolled up in %.1f s (%d hours current, %d without a closed summary)",
                     done.hours_built, done.days_rolled, done.took_s, done.hours_current, done.hours_without_summary)
        return done

    def serve(self, w: data.Window) -> data.Bundle | None:
        """`w`'s figures if this warmer has them: this period's, or the previous period's while
        this one's are being computed. None: the page computes them (data.window_bundle)."""
        done = self._served(w)
        return done.bundle if done is not None else None

    def serve_health(self, w: data.Window) -> dict | None:
        """`w`'s GPU health, as `serve` its figures. None: the page computes it (data.health_for)."""
        done = self._served(w)
        return done.health if done is not None else None

    def _served(self, w: data.Window) -> _Done | None:
        if w.preset not in self.presets or w.filters != Filters() or w.epoch is None:
            return None
        key = (w.root, w.fingerprint, w.preset)
        with self._lock:
            done = self._done.get(key)
            if done is not None and (done.epoch == w.epoch or (done.epoch == w.epoch - 1 and key in self._busy)):
                return done
        return None

    def status(self) -> list[dict]:
        """One row per preset for the Health page: its last computation and its last failure;
        and the hour facts' (FACTS), once built or failed."""
        empty = {"computed_at": None, "took_s": None, "start": None, "end": None}
        rows = [{"preset": p, **self.computed.get(p, empty), "error": self.errors.get(p)} for p in self.presets]
        if FACTS in self.computed or FACTS in self.errors:
            rows.append({"preset": FACTS, **self.computed.get(FACTS, empty), "error": self.errors.get(FACTS)})
        return rows

    def seconds_to_next_period(self, now: datetime) -> float:
        """Until the soonest of the presets' next periods starts (a second past it)."""
        t = data._epoch_s(now)  # the seconds data.make_window numbers periods by
        steps = [data.step_for(dconfig.WINDOWS[p]).total_seconds() for p in self.presets] or [FACTS_PERIOD.total_seconds()]
        return min(step - t % step for step in steps) + 1.0

    def start(self, settings: Callable[[], dconfig.Settings]) -> "Warmer":
        """Warm now and at every period's start, in a daemon thread, for the process' life (with
        no preset, only the hour facts: every FACTS_PERIOD)."""
        def loop() -> None:
            data.work_ahead()
            while True:
                try:
                    self.warm(settings())
                except Exception:  # noqa: BLE001 - the settings could not be read: try again next period
                    log.exception("warming the presets' figures failed")
                time.sleep(self.seconds_to_next_period(self.clock()))

        if self.presets or settings().dashboard["facts_days"]:
            _quiet_streamlit_context()
            threading.Thread(target=loop, name=THREAD, daemon=True).start()
        return self


def _warmed(w: data.Window) -> data.Bundle | None:
    """`w`'s figures as the warmer computed them ahead, in the served app (Warmer.serve); None:
    it has none (the page's own are read or computed)."""
    return warmer(data.current_settings()).serve(w) if dconfig.warm_asked() else None


def for_window(w: data.Window) -> data.Bundle:
    """`w`'s figures: the warmer's when it has them (in the served app), else data.window_bundle's."""
    bundle = _warmed(w)
    return bundle if bundle is not None else data.window_bundle(w.key)


def jobs_for(w: data.Window) -> data.JobList:
    """`w`'s job list for the Jobs page: the warmer's when it has the window's figures, else read
    from its hour facts alone (data.window_jobs), else its Bundle's (data.window_bundle)."""
    bundle = _warmed(w)
    if bundle is not None:
        return data.JobList.of(bundle)
    listed = data.window_jobs(w.key)
    return listed if listed is not None else data.JobList.of(data.window_bundle(w.key))


def mfu_for(w: data.Window) -> data.MfuView:
    """`w`'s figures for the MFU page: the warmer's when it has them, else data.window_mfu's
    (read from its hour facts where they answer it, else its Bundle's)."""
    bundle = _warmed(w)
    if bundle is not None and not bundle.mfu_apart:
        return data.MfuView.of(bundle)
    return data.window_mfu(w.key)


def use_for(w: data.Window) -> data.UseView:
    """`w`'s figures for the Utilization and Teams pages: the warmer's when it has them, else
    data.window_use's - summed from hour facts where they answer the window (then the other
    pages' figures are read from them in the background once the page is drawn: compute_ahead)."""
    bundle = _warmed(w)
    return data.UseView.of(bundle) if bundle is not None else data.window_use(w.key)


def waste_for(w: data.Window) -> data.WasteView:
    """`w`'s figures for the Waste page: the warmer's when it has them, else read from its hour
    facts (data.window_waste, with the Utilization page's figures by model and host:
    data.window_use), else its Bundle's (data.window_bundle)."""
    bundle = _warmed(w)
    if bundle is not None:
        return data.WasteView.of(bundle)
    use = data.window_use(w.key)
    if use.facts_hours:
        got = data.window_waste(w.key)
        if got is not None:
            return data.WasteView(got.totals, got.waste, got.top_jobs, use.utilization, use.window, use.facts_hours)
    return data.WasteView.of(data.window_bundle(w.key))


def compute_ahead(w: data.Window) -> None:
    """Start reading a typed window's figures from its hour facts in the background (_prefetch)
    once a page that names it is drawn - whichever page is opened first, the others' figures are
    then on their way -, where its facts can answer it (data.facts_answer: a preset's never can, a
    filtered window's not all)."""
    if data.facts_answer(w.key):
        _prefetch(w.key)


def fairness_for(w: data.Window) -> tuple:
    """`w`'s fairness figures for the Teams page, (report, None) or (None, why it failed): the
    warmer's when it has them, else data.window_fairness's (from the accounting alone)."""
    bundle = _warmed(w)
    if bundle is not None:
        return bundle.fairness, bundle.fairness_error
    return data.window_fairness(w.key)


_PREFETCHING: set[tuple] = set()
_PREFETCH_LOCK = threading.Lock()


def _prefetch(key: tuple) -> None:
    """Every page's figures of a window from its hour facts (data.window_use, window_jobs,
    window_waste, window_mfu: in the menu's order), in a daemon thread working ahead
    (data.work_ahead: a page opened meanwhile has the cores first), into the caches the pages
    read - no page of a window its facts answer needs its whole Bundle -, one at a time
    per process: an operator stepping through windows must not start a computation for each (an
    analysis at 16,384 GPUs: ~4 GiB); a window asked while one runs is computed when its page
    asks."""
    with _PREFETCH_LOCK:
        if _PREFETCHING:
            return
        _PREFETCHING.add(key)

    def run() -> None:
        data.work_ahead()
        try:
            if data.window_use(key).facts_hours:  # (else its Bundle was computed: every page's figures)
                data.window_jobs(key)
                data.window_waste(key)
                data.window_mfu(key)
        except Exception:  # noqa: BLE001 - the page that needs it computes it, and says what failed
            log.exception("computing a window's figures ahead failed")
        finally:
            with _PREFETCH_LOCK:
                _PREFETCHING.discard(key)

    _quiet_streamlit_context()
    threading.Thread(target=run, name=f"{THREAD}-prefetch", daemon=True).start()


def _quiet_streamlit_context() -> None:
    """Streamlit's "missing ScriptRunContext" warning, once per process, for this module's threads."""
    global _QUIETED
    if not _QUIETED:
        logging.getLogger(_STREAMLIT_CONTEXT_LOG).addFilter(lambda _record: not threading.current_thread().name.startswith(THREAD))
        _QUIETED = True


_QUIETED = False


def health_for(w: data.Window) -> dict:
    """`w`'s GPU health for the Health page: the warmer's when it has it, else data.health_for's."""
    if dconfig.warm_asked():
        health = warmer(data.current_settings()).serve_health(w)
        if health is not None:
            return health
    return data.health_for(w)


def warmer(s: dconfig.Settings) -> Warmer:
    """The process' warmer for these settings, started at the first ask."""
    return _warmer(tuple(s.dashboard["warm_windows"]))


@st.cache_resource(show_spinner=False)
def _warmer(presets: tuple[str, ...]) -> Warmer:
    return Warmer(presets).start(data.current_settings)
