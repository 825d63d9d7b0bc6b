"""The [report] section: who gets the weekly report, how it is mailed, and when.

    [report]
    recipients = ["gpu-managers@example.org"]     # the whole report
    from_address = "gpufleet@example.org"
    out_dir = ""                                   # keep a copy of every report here ("" = don't)
    top_jobs = 10
    pdf = true
    chromium = ""                                  # the browser that prints the PDF ("" = find one)

    [report.team_recipients]                       # account -> addresses: their own team's section
    physics = ["physics-lead@example.org"]

    [report.smtp]
    host = "smtp.example.org"
    port = 587
    starttls = true                                # STARTTLS after connecting (port 587)
    ssl = false                                    # TLS from the first byte (SMTPS, port 465)
    username = ""                                  # "" = no AUTH
    password_file = ""                             # the password, alone in a file (mode 0600)
    timeout = 30
    ca_file = ""                                   # CA bundle for a private CA ("" = the system's)

    [report.schedule]                              # the collector service mails the report weekly
    enabled = true                                 # (and only when there are recipients)
    weekday = "mon"
    hour = 7
    minute = 0
    timezone = "UTC"                               # also the zone in which weeks begin (Monday 00:00)

Every check names the key, the value and what was expected (gpufleet.config). Addresses are
checked strictly (no spaces, commas or line breaks), so a value cannot smuggle extra headers or
recipients into a message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpufleet.config import ConfigError, Option, boolean, gather, integer, number, section, string

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_ADDRESS = re.compile(r"^[^@\s,;<>\"()\[\]\\]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


def is_address(v: Any) -> bool:
    return isinstance(v, str) and bool(_ADDRESS.match(v))


def addresses(v: Any) -> bool:
    return isinstance(v, list) and all(is_address(x) for x in v)


def is_timezone(v: Any) -> bool:
    if not isinstance(v, str) or not v:
        return False
    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


TOP = (
    Option("recipients", [], "a list of e-mail addresses, e.g. [\"gpu-managers@example.org\"]", addresses),
    Option("team_recipients", {}, "a table of account -> list of e-mail addresses", lambda v: isinstance(v, dict)),
    Option("from_address", "gpufleet@localhost", "an e-mail address", is_address),
    Option("out_dir", "", "a directory path, or \"\" to keep no copy", string),
    Option("top_jobs", 10, "an integer >= 1", integer(1)),
    Option("pdf", True, "true or false", boolean),
    Option("chromium", "", "a Chromium executable name or path, or \"\" to look for one", string),
    Option("smtp", {}, "a table", lambda v: isinstance(v, dict)),
    Option("schedule", {}, "a table", lambda v: isinstance(v, dict)),
)

SMTP = (
    Option("host", "localhost", "a host name", lambda v: isinstance(v, str) and bool(v) and not any(c.isspace() for c in v)),
    Option("port", 25, "a port number 1..65535", lambda v: integer(1)(v) and v <= 65535),
    Option("starttls", False, "true or false", boolean),
    Option("ssl", False, "true or false (TLS from the first byte, SMTPS)", boolean),
    Option("username", "", "a user name, or \"\" for no authentication", string),
    Option("password_file", "", "a path to a file holding the password, or \"\"", string),
    Option("timeout", 30.0, "a number of seconds > 0", number(0)),
    Option("ca_file", "", "a PEM file of CA certificates to trust for the server, or \"\" for the system's", string),
)

SCHEDULE = (
    Option("enabled", True, "true or false", boolean),
    Option("weekday", "mon", f"one of {', '.join(WEEKDAYS)}", lambda v: v in WEEKDAYS),
    Option("hour", 7, "an integer hour 0..23", lambda v: integer(0)(v) and v <= 23),
    Option("minute", 0, "an integer minute 0..59", lambda v: integer(0)(v) and v <= 59),
    Option("timezone", "UTC", "an IANA time zone name, e.g. Europe/Berlin", is_timezone),
)


@dataclass(frozen=True)
class Smtp:
    host: str = "localhost"
    port: int = 25
    starttls: bool = False
    ssl: bool = False
    username: str = ""
    password_file: str = ""
    timeout: float = 30.0
    ca_file: str = ""

    def password(self) -> str | None:
        """The password from password_file (trailing newline stripped); None without a file."""
        if not self.password_file:
            return None
        try:
            return Path(self.password_file).read_text().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"[report.smtp] password_file = {self.password_file!r}: cannot read it ({e.strerror}): expected a readable file") from None


@dataclass(frozen=True)
class Schedule:
    enabled: bool = True
    weekday: str = "mon"
    hour: int = 7
    minute: int = 0
    timezone: str = "UTC"


@dataclass(frozen=True)
class ReportConfig:
    recipients: tuple[str, ...] = ()
    team_recipients: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    from_address: str = "gpufleet@localhost"
    out_dir: str = ""
    top_jobs: int = 10
    pdf: bool = True
    chromium: str = ""
    smtp: Smtp = field(default_factory=Smtp)
    schedule: Schedule = field(default_factory=Schedule)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.schedule.timezone)

    @property
    def has_recipients(self) -> bool:
        return bool(self.recipients) or any(self.team_recipients.values())


def load(doc: Mapping[str, Any], path: Any) -> ReportConfig:
    """Validate [report] and its sub-tables; raises ConfigError naming key, value and expectation."""
    top = section(doc, "report", TOP, path)
    smtp, sched = gather(lambda: section(top, "smtp", SMTP, path, parent="report"),
                         lambda: section(top, "schedule", SCHEDULE, path, parent="report"))
    where = f"config {path or '(defaults)'} [report.team_recipients]"
    problems = [f"{where}: {team} = {addrs!r}: expected a list of e-mail addresses"
                for team, addrs in top["team_recipients"].items() if not addresses(addrs)]
    teams = {str(team): tuple(addrs) for team, addrs in top["team_recipients"].items()}
    if smtp["ssl"] and smtp["starttls"]:
        problems.append(f"config {path or '(defaults)'} [report.smtp]: ssl = true and starttls = true: expected at most one of them")
    if smtp["username"] and not smtp["password_file"]:
        problems.append(f"config {path or '(defaults)'} [report.smtp]: username = {smtp['username']!r} but password_file = \"\": "
                        "expected a password_file for the user")
    if problems:
        raise ConfigError(*problems)
    return ReportConfig(
        recipients=tuple(top["recipients"]), team_recipients=teams, from_address=top["from_address"], out_dir=top["out_dir"],
        top_jobs=top["top_jobs"], pdf=top["pdf"], chromium=top["chromium"], smtp=Smtp(**smtp), schedule=Schedule(**sched),
    )
