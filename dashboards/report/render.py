"""Render the figure model: self-contained HTML (inline CSS and SVG, nothing fetched when it is
viewed), a plain-text summary, and the mail subject.

The HTML template is autoescaped (Jinja2): a job called `<script>` is printed as text. The only
markup inserted unescaped is the SVG from gpufleet.report.charts, which escapes its own text.
Every figure cell carries `data-fig="<section>.<key>.<field>"` so a test (or a curious reader with
the browser's inspector) can tie a printed number to the analytics figure it came from.
"""

from __future__ import annotations

from functools import cache

from gpufleet.analytics import vocabulary as words
from gpufleet.report import charts, fmt
from gpufleet.report.model import Report



@cache
def environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpufleet.report", "templates"),
        autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        hours=fmt.hours, usd=fmt.usd, pct=fmt.pct, share=fmt.share, ratio=fmt.ratio, duration=fmt.duration,
        value=fmt.value, change=fmt.change, change_pct=fmt.change_pct, plain=fmt.plain, clip=fmt.clip,
        verdict=words.verdict, state=words.state,
        ljust=lambda s, n: str(s).ljust(n), rjust=lambda s, n: str(s).rjust(n),
    )
    env.globals["table"] = text_table
    return env


def text_table(header: list[str], rows: list[list[object]], indent: str = "  ") -> str:
    """Columns padded to their widest cell; a column whose header ends in '>' is right-aligned."""
    right = [h.endswith(">") for h in header]
    head = [h.rstrip(">") for h in header]
    cells = [[fmt.clip(c, 40) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(head)]

    def line(cols: list[str]) -> str:
        return indent + "  ".join(c.rjust(wd) if r else c.ljust(wd) for c, wd, r in zip(cols, widths, right)).rstrip()

    return "\n".join([line(head)] + [line(r) for r in cells])


def chart_svgs(report: Report) -> dict[str, str]:
    """SVG per chart: daily, waste (fleet report only), shares, goodput (the fleet's); "" where there is none."""
    out = {"daily": "", "waste": "", "shares": "", "goodput": ""}
    if not report.has_data:
        return out
    if report.daily:
        out["daily"] = charts.daily_utilization(report.daily, report.totals.utilization_pct)
    if report.team is None:
        out["waste"] = charts.waste_by_team(report.teams)
    out["shares"] = charts.share_vs_entitlement(report.teams)
    if report.goodput is not None:
        out["goodput"] = charts.goodput_waterfall(report.goodput["fleet"])
    return out


def title(report: Report) -> str:
    t = f"GPU waste report {report.window.label}"
    return t + (f" \u2014 team {fmt.clip(report.team or '(no account)', 60)}" if report.team is not None else "")


def subject(report: Report) -> str:
    """One line, no control characters: the mail subject."""
    if not report.has_data:
        return f"{title(report)}: no data"
    t = report.totals
    parts = []
    if report.team is not None and report.teams:
        r = report.teams[0]
        parts.append(f"{fmt.usd(r.idle_cost)} idle")
        parts.append(f"utilization {fmt.pct(r.utilization_pct)}")
    else:
        h = {row.figure: row for row in report.headline}
        idle = h["idle_allocated_cost"]
        parts.append(f"{fmt.usd(idle.current)} idle" if idle.missing is None else f"idle cost {idle.missing}")
        util = h["utilization_pct"]
        parts.append(f"utilization {fmt.pct(util.current)}" if util.missing is None else f"utilization {util.missing}")
        if t.allocated_gpu_h is None:
            parts.append("allocated GPU-hours unknown")  # (no job's GPU count is known)
        elif t.allocated_gpu_h:
            parts.append(f"{words.known_gpu_h(t.allocated_gpu_h, t.allocated_unknown_jobs)} allocated")
    return fmt.plain(f"{title(report)}: " + ", ".join(parts))


def recompute_command(report: Report) -> str:
    """The `gpufleet analyze` command that recomputes the report's figures, complete and runnable as
    printed (shell-quoted): the configuration and store the report used, its window in UTC, the
    team's account for a team's report, the report's number of jobs listed. The one place this
    command is built; both renderings print it."""
    import shlex

    argv = ["gpufleet", "analyze"]
    if report.config_path is not None:
        argv += ["--config", report.config_path]
    if report.store is not None:
        argv += ["--store", report.store]
    argv += ["--from", f"{report.window.start:%Y-%m-%dT%H:%M:%SZ}", "--to", f"{report.window.end:%Y-%m-%dT%H:%M:%SZ}"]
    if report.team is not None:
        argv += ["--account", report.team]
    argv += ["--by", "account", "--top", str(report.top_n), "--format", "json"]
    return fmt.plain(shlex.join(argv))


def _context(report: Report) -> dict:
    return {"r": report, "title": title(report), "charts": chart_svgs(report), "recompute": recompute_command(report)}


def html(report: Report) -> str:
    return environment().get_template("report.html.j2").render(**_context(report))


def text(report: Report) -> str:
    return environment().get_template("report.txt.j2").render(**_context(report))
