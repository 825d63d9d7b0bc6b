"""The weekly waste report as a job of the collector service's APScheduler.

    job = report_job.prepare(doc, config_path)   # at start: validates [report]; None if not scheduled
    if job: job.add_to(scheduler)                # cron: [report.schedule] weekday, hour, minute, timezone

Each run reports the last complete ISO week in the schedule's time zone (a Monday 07:00 run
reports the week that ended at Monday 00:00), reading the store the way every reader does, so
it never blocks the writer. It mails the fleet report to [report] recipients and each team's
own report to its team_recipients, and keeps a copy under [report] out_dir if set. A run never
raises: if the store cannot be read, every recipient gets a short "not available" note with the
reason instead of a silent gap, and the failure is logged.

The collector service runs it through the hook the shell hands in (`scheduled`, wired by
gpufleet/cli.py): the report sits above the collector, which imports nothing of it. The report's
own modules are imported only when a [report] section exists, so a collector without the report
extra still runs, and one with a [report] but without the extra says so at start.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from gpufleet.config import ConfigError
from gpufleet.times import utcnow

log = logging.getLogger(__name__)

JOB_ID = "weekly-report"
MISFIRE_GRACE_S = 6 * 3600  # a run delayed up to 6 h (busy executor, suspended host) still goes


class ReportJob:
    def __init__(self, settings: Any, clock: Callable[[], datetime] = utcnow):
        self.settings = settings  # gpufleet.report.pipeline.Settings
        self.clock = clock
        self.last_result: bool | None = None

    @property
    def schedule(self):
        return self.settings.report.schedule

    def trigger(self):
        from apscheduler.triggers.cron import CronTrigger

        s = self.schedule
        return CronTrigger(day_of_week=s.weekday, hour=s.hour, minute=s.minute, timezone=s.timezone)

    def add_to(self, scheduler: Any):
        """Add the weekly job to an APScheduler 3 scheduler; returns the Job."""
        s = self.schedule
        job = scheduler.add_job(self, self.trigger(), id=JOB_ID, name="weekly waste report", max_instances=1, coalesce=True,
                                misfire_grace_time=MISFIRE_GRACE_S, replace_existing=True)
        log.info("weekly report scheduled: %s %02d:%02d %s", s.weekday, s.hour, s.minute, s.timezone)
        return job

    def __call__(self) -> bool:
        try:
            self.last_result = self.run()
        except Exception:  # noqa: BLE001 - a report bug must not stop the collector
            log.exception("weekly report failed unexpectedly")
            self.last_result = False
        return self.last_result

    def run(self) -> bool:
        from pathlib import Path

        from gpufleet.report import pipeline
        from gpufleet.report.mail import MailError, send
        from gpufleet.report.window import last_complete_week, week_window
        from gpufleet.collector.store import StoreError

        now = self.clock()
        now = now if now.tzinfo else now.replace(tzinfo=timezone.utc)
        cfg = self.settings.report
        window = week_window(*last_complete_week(now, cfg.schedule.timezone), cfg.schedule.timezone)
        naive_now = now.astimezone(timezone.utc).replace(tzinfo=None)
        log.info("weekly report %s: building", window.label)
        try:
            outputs = pipeline.make(self.settings, window, now=naive_now)
        except StoreError as e:
            log.error("weekly report %s not produced: the store is unreachable: %s", window.label, e)
            note = pipeline.unavailable_message(cfg, window, f"the store is unreachable: {e}")
            try:
                send([note] if note else [], cfg.smtp)
            except (MailError, ConfigError) as me:
                log.error("weekly report %s: could not mail the notice either: %s", window.label, me)
            return False
        if cfg.out_dir:
            try:
                pipeline.write(outputs, Path(cfg.out_dir))
            except OSError as e:
                log.error("weekly report %s: cannot keep a copy in %s: %s", window.label, cfg.out_dir, e)
        try:
            n = send(pipeline.messages(outputs, cfg), cfg.smtp)
        except (MailError, ConfigError) as e:
            log.error("weekly report %s built but not mailed: %s", window.label, e)
            return False
        log.info("weekly report %s: mailed %d message(s)", window.label, n)
        return all(o.pdf is not None for o in outputs) or not cfg.pdf


def prepare(doc: Mapping[str, Any], path: Any, *, clock: Callable[[], datetime] = utcnow) -> ReportJob | None:
    """Validate [report] at start (ConfigError names key, value, expectation) and return the job,
    or None when no report is scheduled (no [report] section, schedule disabled, or no recipients)."""
    if not isinstance(doc.get("report"), dict):
        return None
    try:
        from gpufleet.report import pipeline
    except ModuleNotFoundError as e:
        raise ConfigError(f"config {path} [report]: a weekly report is configured but {e.name} is not installed: "
                          "pip install 'gpufleet[report]'") from None

    settings = pipeline.load_settings(doc, path)
    cfg = settings.report
    if not cfg.schedule.enabled:
        log.info("weekly report not scheduled: [report.schedule] enabled = false")
        return None
    if not cfg.has_recipients:
        log.info("weekly report not scheduled: [report] has no recipients")
        return None
    cfg.smtp.password()  # an unreadable password file is found at start, not next Monday
    return ReportJob(settings, clock)


def scheduled(doc: Mapping[str, Any], path: Any) -> Callable[[Any], Any] | None:
    """The collector service's hook (gpufleet collect, wired by the shell): the weekly job's
    `add_to`, or None when no report is scheduled."""
    job = prepare(doc, path)
    return (lambda scheduler, _collector=None: job.add_to(scheduler)) if job else None
