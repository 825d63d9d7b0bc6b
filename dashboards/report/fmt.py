"""How the report writes numbers: one function per kind, shared by the HTML, the text and the charts,
so a figure reads the same everywhere (and tests can format the analytics' figure and find it).

The formats are the dashboards' and the CLI's (gpufleet.analytics.vocabulary): GPU-hours one decimal
(1,234.5), money US dollars with cents and thousands separators ($4,724.00 beside $945.53: a finance
reader adds them up as printed), percentages one decimal, durations in two units ("2 h 48 min"). A
missing figure is never written as 0.
"""

from __future__ import annotations

from gpufleet.analytics import vocabulary as words

MINUS = words.MINUS
_bad = words.bad
hours = words.gpu_h
usd = words.usd
pct = words.pct
duration = words.duration


def share(v: float | None) -> str:
    """A fraction 0..1 as a percentage."""
    return "\u2013" if _bad(v) else pct(v * 100)


def ratio(v: float | None) -> str:
    return "\u2013" if _bad(v) else f"{v:.2f}"


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
