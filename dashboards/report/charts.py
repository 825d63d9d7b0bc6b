"""Charts as inline SVG, drawn here: no JavaScript, no network, the same picture in a browser, in
an e-mail client that shows SVG, and in Chromium's PDF.

Each function takes figures already in the report model and returns an <svg> string. Every piece
of text from the data (team names) is XML-escaped here, because the template inserts the SVG as
markup.
"""

from __future__ import annotations

from html import escape
from typing import Iterable, Sequence

from gpufleet.report.fmt import usd
from gpufleet.report.model import DailyPoint, TeamRow

FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
INK, MUTED, GRID = "#1f2933", "#616e7c", "#e4e7eb"
BLUE, ORANGE, GRAY, RED = "#2f6fb0", "#d9822b", "#b8c2cc", "#c23b22"


def _t(s: str) -> str:
    return escape(s, quote=True)


def _short(s: str, n: int = 22) -> str:
    s = "".join(c if c.isprintable() else "\ufffd" for c in s) or "(no account)"
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _svg(width: int, height: int, title: str, body: Iterable[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
            f'style="max-width:{width}px" role="img" aria-label="{_t(title)}" {FONT} font-size="12">'
            f"<title>{_t(title)}</title>" + "".join(body) + "</svg>")


def daily_utilization(points: Sequence[DailyPoint], overall_pct: float | None) -> str:
    """Columns: each day's fleet utilization (%); a dashed line at the window's figure."""
    w, h, left, right, top, bottom = 680, 210, 44, 16, 22, 36
    pw, ph = w - left - right, h - top - bottom
    out: list[str] = []
    for pct in (0, 25, 50, 75, 100):
        y = top + ph * (1 - pct / 100)
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{MUTED}">{pct}%</text>')
    n = max(1, len(points))
    slot = pw / n
    bw = min(56.0, slot * 0.62)
    for i, p in enumerate(points):
        cx = left + slot * (i + 0.5)
        label = p.day.strftime("%a %d") if n <= 14 else p.day.strftime("%d")
        out.append(f'<text x="{cx:.1f}" y="{h - bottom + 16}" text-anchor="middle" fill="{INK}">{_t(label)}</text>')
        if p.utilization_pct is None:
            word = "to come" if p.future else "no data"
            out.append(f'<text x="{cx:.1f}" y="{top + ph - 6:.1f}" text-anchor="middle" fill="{MUTED}" font-style="italic">{word}</text>')
            continue
        bh = ph * max(0.0, min(100.0, p.utilization_pct)) / 100
        out.append(f'<rect x="{cx - bw / 2:.1f}" y="{top + ph - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" fill="{BLUE}" rx="2">'
                   f'<title>{_t(p.day.isoformat())}: {p.utilization_pct:.1f}% of {p.data_gpu_h:,.1f} GPU-hours with data</title></rect>')
        if n <= 14:
            out.append(f'<text x="{cx:.1f}" y="{top + ph - bh - 5:.1f}" text-anchor="middle" fill="{INK}">{p.utilization_pct:.0f}%</text>')
    if overall_pct is not None:
        y = top + ph * (1 - overall_pct / 100)
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="{ORANGE}" stroke-width="2" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{w - right}" y="{y - 5:.1f}" text-anchor="end" fill="{ORANGE}">window {overall_pct:.1f}%</text>')
    out.append(f'<line x1="{left}" x2="{w - right}" y1="{top + ph}" y2="{top + ph}" stroke="{MUTED}"/>')
    return _svg(w, h, "Daily fleet utilization", out)


def waste_by_team(rows: Sequence[TeamRow], limit: int = 10) -> str:
    """Horizontal bars: cost of idle allocated time per team (GPU-hours if any cost is unknown)."""
    rows = [r for r in rows if r.idle_gpu_h > 0]
    by_cost = all(r.idle_cost is not None for r in rows)
    value = (lambda r: r.idle_cost) if by_cost else (lambda r: r.idle_gpu_h)
    rows = sorted(rows, key=lambda r: (-value(r), r.account))
    shown, rest = rows[:limit], rows[limit:]
    items = [(r.account, value(r)) for r in shown]
    if rest:
        items.append((f"{len(rest)} other teams", sum(value(r) for r in rest)))
    title = "Cost of idle allocated GPU time by team" if by_cost else "Idle allocated GPU-hours by team"
    if not items:
        return _svg(680, 60, title, [f'<text x="340" y="34" text-anchor="middle" fill="{MUTED}">No idle allocated GPU time in this window.</text>'])
    w, left, right, bar, gap = 680, 170, 90, 18, 8
    h = 12 + len(items) * (bar + gap)
    top = 6
    peak = max(v for _, v in items) or 1.0
    out = []
    for i, (name, v) in enumerate(items):
        y = top + i * (bar + gap)
        bw = (w - left - right) * v / peak
        text = usd(v) if by_cost else f"{v:,.1f} GPU-h"
        out.append(f'<text x="{left - 8}" y="{y + bar - 5}" text-anchor="end" fill="{INK}"><title>{_t(name or "(no account)")}</title>{_t(_short(name))}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{max(bw, 1):.1f}" height="{bar}" fill="{RED}" rx="2"/>')
        out.append(f'<text x="{left + bw + 6:.1f}" y="{y + bar - 5}" fill="{INK}">{_t(text)}</text>')
    return _svg(w, h, title, out)


def goodput_waterfall(fleet: Sequence[dict]) -> str:
    """Horizontal bars, one per step of the goodput waterfall (gpufleet.analytics.goodput), each
    with its GPU-hours and cost; an unknown step says so instead of a bar."""
    title = "Goodput waterfall: where the capacity went"
    known = [r["gpu_h"] for r in fleet if r["gpu_h"] is not None]
    if not known or max(known) <= 0:
        return _svg(680, 60, title, [f'<text x="340" y="34" text-anchor="middle" fill="{MUTED}">No GPU capacity in this window.</text>'])
    w, left, right, bar, gap, top = 680, 190, 150, 18, 8, 6
    h = 12 + len(fleet) * (bar + gap)
    peak = max(known)
    out = []
    for i, r in enumerate(fleet):
        y = top + i * (bar + gap)
        out.append(f'<text x="{left - 8}" y="{y + bar - 5}" text-anchor="end" fill="{INK}">{_t(r["label"])}</text>')
        if r["gpu_h"] is None:
            out.append(f'<text x="{left}" y="{y + bar - 5}" fill="{MUTED}" font-style="italic">unknown</text>')
            continue
        bw = (w - left - right) * r["gpu_h"] / peak
        text = f"{'at least ' if r['unknown_teams'] else ''}{r['gpu_h']:,.1f} GPU-h" + (f", {usd(r['cost'])}" if r["cost"] is not None else "")
        out.append(f'<rect x="{left}" y="{y}" width="{max(bw, 1):.1f}" height="{bar}" fill="{BLUE if i < 4 else ORANGE}" rx="2"/>')
        out.append(f'<text x="{left + bw + 6:.1f}" y="{y + bar - 5}" fill="{INK}">{_t(text)}</text>')
    return _svg(w, h, title, out)


def share_vs_entitlement(rows: Sequence[TeamRow], limit: int = 12) -> str:
    """Per team: entitled share (gray) against allocated share (blue) of the fleet's allocated GPU-hours."""
    rows = [r for r in rows if r.entitled_share is not None or r.used_share is not None]
    rows = sorted(rows, key=lambda r: (-(r.used_share or 0.0), -(r.entitled_share or 0.0), r.account))[:limit]
    title = "Allocated share vs entitled share"
    if not rows:
        return _svg(680, 60, title, [f'<text x="340" y="34" text-anchor="middle" fill="{MUTED}">No shares or usage to compare.</text>'])
    w, left, right, bar = 680, 170, 70, 11
    group = 2 * bar + 12
    top = 28
    h = top + len(rows) * group + 4
    peak = max(max(r.entitled_share or 0, r.used_share or 0) for r in rows) or 1.0
    pw = w - left - right
    out = [
        f'<rect x="{left}" y="6" width="12" height="10" fill="{GRAY}"/><text x="{left + 16}" y="15" fill="{INK}">entitled</text>',
        f'<rect x="{left + 90}" y="6" width="12" height="10" fill="{BLUE}"/><text x="{left + 106}" y="15" fill="{INK}">allocated</text>',
    ]
    for i, r in enumerate(rows):
        y = top + i * group
        out.append(f'<text x="{left - 8}" y="{y + bar + 4}" text-anchor="end" fill="{INK}"><title>{_t(r.account or "(no account)")}</title>{_t(_short(r.account))}</text>')
        for j, (v, colour) in enumerate(((r.entitled_share, GRAY), (r.used_share, BLUE))):
            yy = y + j * (bar + 1)
            if v is None:
                out.append(f'<text x="{left + 4}" y="{yy + bar - 1}" fill="{MUTED}" font-size="10" font-style="italic">{"no share" if j == 0 else "no demand"}</text>')
                continue
            bw = pw * v / peak
            out.append(f'<rect x="{left}" y="{yy}" width="{max(bw, 1):.1f}" height="{bar}" fill="{colour}" rx="1"/>')
            out.append(f'<text x="{left + bw + 5:.1f}" y="{yy + bar - 1}" fill="{INK}" font-size="10">{v * 100:.1f}%</text>')
    return _svg(w, h, title, out)
