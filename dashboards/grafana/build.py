#!/usr/bin/env python3
"""Render the Grafana dashboards (dashboards/grafana/dashboards/*.json) from src/dashboards.yml.

    python dashboards/grafana/build.py           rewrite dashboards/grafana/dashboards/
    python dashboards/grafana/build.py --check   exit 1 (and say which file) if they are stale

Why a generator: each PromQL expression is written once (src/dashboards.yml `expressions:`), the
thresholds, windows and label sets are the alert rules' own (alerts/thresholds.yml, alerts/build.py),
and the tests query exactly the expressions the panels draw (tests/test_grafana.py). Needs PyYAML.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "src" / "dashboards.yml"
OUT = HERE / "dashboards"
ALERTS_BUILD = HERE.parents[1] / "alerts" / "build.py"

GRID_WIDTH = 24  # Grafana's grid has 24 columns
SCHEMA_VERSION = 39  # Grafana 10.x/11.x dashboard JSON
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_VARIABLE_RE = re.compile(r"\$(\w+)")
LABEL_VALUES_RE = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")
PANEL_TYPES = ("stat", "timeseries", "table")


class BuildError(Exception):
    pass


def _alerts_build():
    """alerts/build.py, a script rather than a package module: its thresholds and label sets."""
    spec = importlib.util.spec_from_file_location("gpufleet_alerts_build", ALERTS_BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_source(path: Path = SOURCE) -> dict[str, Any]:
    """The source with every placeholder filled: thresholds and label sets first, then the snippets."""
    alerts = _alerts_build()
    try:
        vals, _ = alerts.values(alerts.load_thresholds())
        text = "".join(ln for ln in path.read_text().splitlines(keepends=True) if not ln.lstrip().startswith("#!"))
        raw = yaml.safe_load(text)
        snippets = {name: alerts.render_text(s, vals, f"{path.name} snippets.{name}", set())
                    for name, s in (raw.get("snippets") or {}).items()}
        clash = sorted(set(snippets) & set(vals))
        if clash:
            raise BuildError(f"{path.name}: snippets {', '.join(clash)} clash with names of alerts/build.py")
        doc = yaml.safe_load(alerts.render_text(text, {**vals, **snippets}, path.name, set()))
    except alerts.BuildError as e:
        raise BuildError(str(e)) from None
    for key in ("expressions", "variables", "dashboards"):
        if not isinstance(doc.get(key), dict) or not doc[key]:
            raise BuildError(f"{path.name}: expected a non-empty mapping `{key}:`")
    return doc


def expressions(doc: dict[str, Any] | None = None) -> dict[str, str]:
    """{name: PromQL} of every expression, placeholders filled, Grafana's $variables left in."""
    doc = doc or load_source()
    return {name: " ".join(expr.split()) for name, expr in doc["expressions"].items()}


def variable_selector(query: str) -> tuple[str, str]:
    """(series selector, label) of a `label_values(selector, label)` variable query."""
    m = LABEL_VALUES_RE.match(query.strip())
    if not m:
        raise BuildError(f"variable query {query!r}: expected label_values(selector, label)")
    return m["selector"].strip(), m["label"]


def _variable(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    variable_selector(spec["query"])
    multi = bool(spec.get("multi"))
    return {
        "name": name, "label": spec.get("label", name), "type": "query", "datasource": DATASOURCE,
        "query": {"query": spec["query"], "refId": f"{name}-variable"}, "definition": spec["query"],
        "refresh": 2, "sort": 1, "multi": multi, "includeAll": multi, "regex": "",
        **({"allValue": ".*", "current": {"text": "All", "value": "$__all"}} if multi else {"current": {}}),
    }


def _panel(pid: int, spec: dict[str, Any], exprs: dict[str, str], x: int, y: int, where: str) -> dict[str, Any]:
    kind = spec.get("type")
    if kind not in PANEL_TYPES:
        raise BuildError(f"{where}: type {kind!r}: expected one of {', '.join(PANEL_TYPES)}")
    targets = []
    for i, t in enumerate(spec.get("targets") or []):
        if t.get("expr") not in exprs:
            raise BuildError(f"{where}: target expr {t.get('expr')!r}: expected a name under `expressions:`")
        instant = bool(t.get("instant")) or kind == "stat"
        targets.append({"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": exprs[t["expr"]],
                        "legendFormat": t.get("legend", "__auto"), "instant": instant, "range": not instant})
    if not targets:
        raise BuildError(f"{where}: expected at least one target")
    defaults: dict[str, Any] = {"unit": spec.get("unit", "none")}
    options: dict[str, Any] = {}
    if kind == "stat":
        defaults["noValue"] = "no data"  # unknown is unknown: never shown as 0
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value", "graphMode": "none"}
    elif kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if spec.get("stacked") else "none", "group": "A"}, "fillOpacity": 20 if spec.get("stacked") else 0}
    elif kind == "table":
        options = {"showHeader": True}
    return {
        "id": pid, "type": kind, "title": spec["title"], "description": spec.get("description", ""),
        "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": spec["width"], "h": spec["height"]},
        "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
    }


def dashboard(uid: str, spec: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    exprs = expressions(doc)
    panels, x, y, row_height = [], 0, 0, 0
    for i, p in enumerate(spec["panels"], start=1):
        w = p.get("width")
        if not isinstance(w, int) or not 1 <= w <= GRID_WIDTH:
            raise BuildError(f"dashboards.{uid}.panels[{i - 1}] width {w!r}: expected 1 to {GRID_WIDTH}")
        if x + w > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel(i, p, exprs, x, y, f"dashboards.{uid}.panels[{i - 1}] ({p.get('title')})"))
        x, row_height = x + w, max(row_height, p["height"])
    used = {m for p in panels for t in p["targets"] for m in GRAFANA_VARIABLE_RE.findall(t["expr"])}
    declared = set(spec.get("variables") or [])
    for name in sorted(declared - set(doc["variables"])):
        raise BuildError(f"dashboards.{uid}: variable {name!r}: expected one under `variables:`")
    missing = sorted(used - declared - {"datasource"})
    if missing:
        raise BuildError(f"dashboards.{uid}: its panels use ${', $'.join(missing)} but `variables:` does not list them")
    datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0}
    return {
        "uid": f"gpufleet-{uid}", "title": spec["title"], "description": " ".join(spec.get("description", "").split()),
        "tags": ["gpufleet"], "timezone": "utc", "editable": True, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "refresh": "30s", "time": {"from": "now-6h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": [datasource] + [_variable(v, doc["variables"][v]) for v in spec.get("variables") or []]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


def render(path: Path = SOURCE) -> dict[str, str]:
    """{output file name: JSON text} of every dashboard; an expression no panel draws is an error."""
    doc = load_source(path)
    files = {f"{uid}.json": json.dumps(dashboard(uid, spec, doc), indent=2) + "\n" for uid, spec in doc["dashboards"].items()}
    drawn = {t["expr"] for spec in doc["dashboards"].values() for p in spec["panels"] for t in p["targets"]}
    unused = sorted(set(doc["expressions"]) - drawn)
    if unused:
        raise BuildError(f"{path.name}: expressions no panel draws: {', '.join(unused)}")
    return files


def stale_files(files: dict[str, str], out: Path = OUT) -> list[str]:
    stale = [n for n, text in files.items() if not (out / n).is_file() or (out / n).read_text() != text]
    strays = [p.name for p in out.glob("*.json") if p.name not in files] if out.is_dir() else []
    return sorted(stale + strays)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if dashboards/grafana/dashboards/ is out of date")
    a = p.parse_args(argv)
    try:
        files = render()
    except BuildError as e:
        print(f"dashboards/grafana/build.py: {e}", file=sys.stderr)
        return 2
    if a.check:
        stale = stale_files(files)
        if stale:
            print(f"dashboards/grafana/build.py: out of date in {OUT}: {', '.join(stale)}; run `python dashboards/grafana/build.py`", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    for stray in OUT.glob("*.json"):
        if stray.name not in files:
            stray.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
