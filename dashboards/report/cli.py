"""`gpufleet report`: the weekly waste report of one week (or window), as files and/or e-mail.

    gpufleet report --config gpufleet.toml --week 2026-W46 --out reports/
    gpufleet report --config gpufleet.toml --from 2026-11-09 --to 2026-11-16 --send

Writes <out>/gpufleet-report-<week>.html, .txt and .pdf (one set per team with recipients, too)
and prints the text summary. Exit status: 0 success; 2 bad usage or configuration; 1 runtime
failure (store unreachable, PDF or mail failed - the files that could be made are still written).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gpufleet.config import ConfigError, command_error, load_config
from gpufleet.times import add_window_arguments, window_from_arguments

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([report], [analytics], [collector] sections)")
    p.add_argument("--store", help="store directory (default: [analytics] store, else [collector] store)")
    add_window_arguments(p, week_zone="in [report.schedule] timezone")
    p.add_argument("--out", help="directory for the HTML, PDF and text files (default: [report] out_dir, else .)")
    p.add_argument("--send", action="store_true", help="mail the report to the configured recipients")
    p.add_argument("--team", "--account", dest="team", action="append", default=[], metavar="ACCOUNT",
                   help="also write this team's own report (repeatable; teams in [report.team_recipients] always get one)")
    p.add_argument("--no-pdf", action="store_true", help="skip the PDF (no Chromium needed)")
    p.add_argument("--quiet", action="store_true", help="do not print the text summary")


def window_from_args(args: argparse.Namespace, tz: str):
    from gpufleet.report.window import span_window, week_window

    start, end, week = window_from_arguments(args, tz)
    return week_window(*week, tz) if week else span_window(start, end, tz)


def run(args: argparse.Namespace, out=None) -> int:
    from gpufleet.report import pipeline
    from gpufleet.report.mail import MailError, send
    from gpufleet.collector.store import STORE_FIX, NoStoreError, StoreError

    out = out or sys.stdout
    try:
        doc = load_config(args.config)
        settings = pipeline.load_settings(doc, args.config, args.store)
        window = window_from_args(args, settings.report.schedule.timezone)
        settings.params(window.start, window.end)  # validates [analytics]
        if args.send:
            if not settings.report.has_recipients:
                raise ConfigError(f"--send: config {args.config or '(defaults)'} [report] has no recipients or team_recipients: "
                                  "expected at least one address")
            settings.report.smtp.password()  # a missing password file is a configuration error, found now
    except ConfigError as e:
        return command_error("report", e)
    out_dir = Path(args.out or settings.report.out_dir or ".")
    try:
        outputs = pipeline.make(settings, window, pdf=False if args.no_pdf else None, 
                                teams=list(dict.fromkeys([*settings.report.team_recipients, *args.team])))
    except StoreError as e:
        if args.send:
            note = pipeline.unavailable_message(settings.report, window, f"the store is unreachable: {e}")
            try:
                send([note] if note else [], settings.report.smtp)
            except (MailError, ConfigError) as me:
                log.error("could not mail the notice either: %s", me)
        if isinstance(e, NoStoreError):  # nothing there: the command named the wrong store (usage)
            return command_error("report", f"no report for {window.label}: {e}: {STORE_FIX}")
        return command_error("report", f"no report for {window.label}: the store is unreachable: {e}", 1)
    paths = pipeline.write(outputs, out_dir)
    ok = all(o.pdf is not None for o in outputs) or args.no_pdf or not settings.report.pdf
    if not args.quiet:
        out.write(outputs[0].text)
        out.write("\n")
    out.write("wrote " + ", ".join(str(p) for p in paths) + "\n")
    if args.send:
        try:
            n = send(pipeline.messages(outputs, settings.report), settings.report.smtp)
            out.write(f"mailed {n} message(s) via {settings.report.smtp.host}:{settings.report.smtp.port}\n")
        except (MailError, ConfigError) as e:
            log.error("report written but not mailed: %s", e)
            return 1
    if not ok:
        log.error("the PDF could not be made (see above); HTML and text were written")
        return 1
    return 0
