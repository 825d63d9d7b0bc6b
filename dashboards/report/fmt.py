"""How the report writes numbers: one function per kind, shared by the HTML, the text and the charts,
so a figure reads the same everywhere (and tests can format the analytics' figure and find it).

GPU-hours: two decimals below 100, one from 100 (1,234.5). Money: one format, US dollars with cents
and thousands separators ($4,724.00 beside $945.53: a finance reader adds them up as printed), in
the HTML, the text, the charts and the subject alike (usd). Percentages: one decimal. A missing
figure is never written as 0.
"""

from __future__ import annotations

import math

MINUS = "\u2212"


def _bad(v: float | None) -> bool:
    return v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


def hours(v: float | None) -> str:
    if _bad(v):
        return "unknown"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:,.2f}"


def usd(v: float | None) -> str:
    """The report's one money format: $1,234.56 (−$3.00 below zero); "unknown" when unknown."""
    if _bad(v):
        return "unknown"
    sign = MINUS if v < 0 else ""
    return f"{sign}${abs(v):,.2f}"


def pct(v: float | None) -> str:
    return "unknown" if _bad(v) else f"{v:.1f}%"


def share(v: float | None) -> str:
    """A fraction 0..1 as a percentage."""
    return "\u2013" if _bad(v) else f"{v * 100:.1f}%"


def ratio(v: float | None) -> str:
    return "\u2013" if _bad(v) else f"{v:.2f}"


def duration(seconds: float | None) -> str:
    if _bad(seconds):
        return "\u2013"
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    m = s / 60
    if m < 90:
        return f"{m:.0f} min"
    h, m = divmod(int(round(m)), 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def value(v: float | None, unit: str) -> str:
    return {"gpu_h": hours, "usd": usd, "pct": pct}[unit](v)


def change(v: float | None, unit: str) -> str:
    """A signed change: +1.25 (GPU-hours), +$3.00, +2.5 pp (percentage points)."""
    if _bad(v):
        return "\u2013"
    sign = "+" if v > 0 else (MINUS if v < 0 else "\u00b1")
    a = abs(v)
    if unit == "usd":
        return sign + usd(a)
    if unit == "pct":
        return f"{sign}{a:.1f} pp"
    return sign + hours(a)


def change_pct(v: float | None) -> str:
    """Relative change; left out beyond +-999 % (against almost nothing it says nothing)."""
    if _bad(v) or abs(v) >= 999.5:
        return ""
    sign = "+" if v > 0 else (MINUS if v < 0 else "\u00b1")
    return f"{sign}{abs(v):.0f}%"


def plain(s: object) -> str:
    """Text from the data, safe on one line of a terminal or a mail header: control characters
    (line breaks, tabs, escape sequences) become U+FFFD; None becomes ''."""
    if s is None:
        return ""
    return "".join(c if c.isprintable() else "\ufffd" for c in str(s))


def clip(s: object, n: int) -> str:
    t = plain(s)
    return t if len(t) <= n else t[: n - 1] + "\u2026"
