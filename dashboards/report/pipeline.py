"""From configuration to delivered report: settings, figures, renderings, files, mail.

Used by `gpufleet report` (dashboards/report/cli.py) and the collector's weekly job
(dashboards/report/job.py), so a scheduled report is exactly the one the command writes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Iterable, Mapping

from gpufleet.report import config as report_config
from gpufleet.report import fmt, render
from gpufleet.report.mail import message
from gpufleet.report.model import Report, for_team, gather
from gpufleet.report.window import Window
from gpufleet.config import ConfigError
from gpufleet.config import gather as gather_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    doc: Mapping[str, Any]
    path: Any
    report: report_config.ReportConfig
    store: Path
    shares: Mapping[str, float] | None = None
    half_life: timedelta = timedelta(days=7)
    reliability: Any = None  # gpufleet.analytics.reliability.Settings ([analytics] reliability_*)

    def params(self, start: datetime, end: datetime):
        from gpufleet.analytics.params import from_config

        return from_config(self.doc, self.path, start, end)


def load_settings(doc: Mapping[str, Any], path: Any, store: str | None = None) -> Settings:
    """Validate [report], [analytics] (with its fairness keys) and find the store. ConfigError."""
    import importlib.util

    from gpufleet.analytics import params
    from gpufleet.analytics.fairness import settings as fairness_settings

    if importlib.util.find_spec("jinja2") is None:
        raise ConfigError("the report needs Jinja2, which is not installed: pip install 'gpufleet[report]'")
    cfg, opts = gather_config(lambda: report_config.load(doc, path), lambda: params.analytics_options(doc, path))
    shares, half_life = fairness_settings(opts)
    root = params.store_path(doc, path, store)
    from gpufleet.analytics.reliability import settings as reliability_settings

    return Settings(doc=doc, path=path, report=cfg, store=root, shares=shares, half_life=half_life,
                    reliability=reliability_settings(opts))


@dataclass
class Output:
    report: Report
    html: str
    text: str
    subject: str
    name: str  # file stem: gpufleet-report-2026-W46[-team-<team>]
    pdf: bytes | None = None
    pdf_error: str | None = None
    files: list[Path] = field(default_factory=list)


def _stem(window: Window, team: str | None) -> str:
    label = window.label if window.week else f"{window.start:%Y%m%dT%H%M}-{window.end:%Y%m%dT%H%M}"
    stem = f"gpufleet-report-{label}"
    if team is not None:
        stem += "-team-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", team).strip("._") or "none")[:60]
    return stem


def render_output(report: Report, *, pdf: bool = True, chromium: str = "") -> Output:
    html = render.html(report)
    out = Output(report=report, html=html, text=render.text(report), subject=render.subject(report), name=_stem(report.window, report.team))
    if pdf:
        import tempfile

        from gpufleet.report.pdf import PdfError, html_to_pdf

        try:
            with tempfile.TemporaryDirectory() as tmp:
                out.pdf = html_to_pdf(html, Path(tmp) / "r.pdf", chromium=chromium).read_bytes()
        except PdfError as e:
            out.pdf_error = str(e)
            log.error("PDF of %s not made: %s", out.name, e)
    return out


def make(settings: Settings, window: Window, *, now: datetime | None = None, pdf: bool | None = None,
         teams: Iterable[str] | None = None, con=None) -> list[Output]:
    """The fleet's report, then one per team in `teams` (default: the teams with recipients).

    Raises gpufleet.collector.store.StoreError when the store cannot be opened.
    """
    from gpufleet.collector.store import open_reader

    if con is None:
        con = open_reader(settings.store)
    pdf = settings.report.pdf if pdf is None else pdf
    params = settings.params(window.start, window.end)
    from gpufleet.analytics.states import thresholds

    fleet = gather(con, params, window, shares=settings.shares, half_life=settings.half_life, top_n=settings.report.top_jobs, now=now,
                   reliability=settings.reliability, state_thresholds=thresholds(settings.doc, settings.path, params))
    fleet = replace(fleet, config_path=None if settings.path is None else str(Path(settings.path).resolve()),
                    store=str(Path(settings.store).resolve()))  # for the report's "recompute with" command
    outputs = [render_output(fleet, pdf=pdf, chromium=settings.report.chromium)]
    for team in (settings.report.team_recipients if teams is None else teams):
        outputs.append(render_output(for_team(fleet, team), pdf=pdf, chromium=settings.report.chromium))
    return outputs


def write(outputs: Iterable[Output], out_dir: Path) -> list[Path]:
    """<stem>.html, <stem>.txt and <stem>.pdf (when made) for every output."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for o in outputs:
        files = [(out_dir / f"{o.name}.html", o.html.encode("utf-8")), (out_dir / f"{o.name}.txt", o.text.encode("utf-8"))]
        if o.pdf is not None:
            files.append((out_dir / f"{o.name}.pdf", o.pdf))
        for p, data in files:
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(p)
            o.files.append(p)
            paths.append(p)
    return paths


def messages(outputs: list[Output], cfg: report_config.ReportConfig) -> list[EmailMessage]:
    """The fleet report to [report] recipients; each team's own report to its team_recipients."""
    out = []
    fleet, teams = outputs[0], {o.report.team: o for o in outputs[1:]}
    targets: list[tuple[Output, tuple[str, ...]]] = []
    if cfg.recipients:
        targets.append((fleet, cfg.recipients))
    for team, to in cfg.team_recipients.items():
        if to and team in teams:
            targets.append((teams[team], to))
    for o, to in targets:
        text = o.text
        if o.pdf is None and o.pdf_error:
            text += f"\n(The PDF could not be made: {fmt.plain(o.pdf_error)})\n"
        out.append(message(sender=cfg.from_address, to=to, subject=o.subject, text=text, html=o.html, pdf=o.pdf, pdf_name=f"{o.name}.pdf"))
    return out


def unavailable_message(cfg: report_config.ReportConfig, window: Window, reason: str) -> EmailMessage | None:
    """A short note to every recipient that this week's report could not be produced, and why."""
    to = tuple(dict.fromkeys([*cfg.recipients, *(a for addrs in cfg.team_recipients.values() for a in addrs)]))
    if not to:
        return None
    again = (f"--week {window.label}" if window.week else
             f"--from {window.start:%Y-%m-%dT%H:%M:%SZ} --to {window.end:%Y-%m-%dT%H:%M:%SZ}")
    text = (f"The GPU waste report for {window.label} ({window.span}) could not be produced.\n\n"
            f"Reason: {fmt.plain(reason)}\n\nNo figures are reported for this week. The operators of gpufleet have the same "
            "message in the collector's log; once the store is reachable again, "
            f"`gpufleet report {again} --send` produces and sends it.\n")
    return message(sender=cfg.from_address, to=to, subject=f"GPU waste report {window.label}: NOT AVAILABLE", text=text)


__all__ = ["Settings", "Output", "load_settings", "make", "write", "messages", "unavailable_message", "ConfigError"]
