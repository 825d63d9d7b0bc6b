"""The report's PDF: printed from the same HTML by headless Chromium; its first page, turned into
an image by pdftoppm, is not blank, and its text (pdftotext) carries the analytics' figures.

Needs Debian's chromium and poppler-utils (installed here as root; skipped without, failed under
CI=true: tests/realstack/policy.py).
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.report import fmt, pipeline
from gpufleet.report.pdf import PdfError, find_chromium
from gpufleet.report.window import week_window
from tests.realstack.debian import ensure_packages, which
from tests.realstack.policy import unavailable
from tests.test_report import HOSTILE_JOB, NOW, settings_for, store  # noqa: F401 - the report store fixture


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    ensure_packages("chromium", "poppler-utils")
    found = {name: which(name) for name in ("chromium", "pdftoppm", "pdftotext")}
    missing = [n for n, p in found.items() if not p]
    if missing:
        unavailable(f"{', '.join(missing)} not found after installing chromium and poppler-utils")
    return found


def read_ppm(path: Path) -> tuple[int, int, bytes]:
    """A binary PPM (P6, maxval < 256): width, height, RGB bytes."""
    data = path.read_bytes()
    fields: list[bytes] = []
    i = 0
    while len(fields) < 4:
        while data[i:i + 1].isspace():
            i += 1
        if data[i:i + 1] == b"#":
            i = data.index(b"\n", i) + 1
            continue
        j = i
        while not data[j:j + 1].isspace():
            j += 1
        fields.append(data[i:j])
        i = j
    assert fields[0] == b"P6", fields[0]
    w, h, maxval = int(fields[1]), int(fields[2]), int(fields[3])
    assert maxval < 256
    pixels = data[i + 1:i + 1 + w * h * 3]
    assert len(pixels) == w * h * 3
    return w, h, pixels


def luminance_stats(pixels: bytes) -> tuple[float, float, float]:
    """(mean, variance, share of pixels darker than mid-gray) of 0.299R + 0.587G + 0.114B."""
    lum = [0.299 * pixels[k] + 0.587 * pixels[k + 1] + 0.114 * pixels[k + 2] for k in range(0, len(pixels), 3)]
    n = len(lum)
    mean = sum(lum) / n
    var = sum((x - mean) ** 2 for x in lum) / n
    return mean, var, sum(1 for x in lum if x < 128) / n


@pytest.fixture(scope="module")
def pdf_report(tools, store, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("pdf")
    outputs = pipeline.make(settings_for(store.root), week_window(2026, 47), now=NOW, pdf=True, teams=["physics"])
    assert all(o.pdf_error is None for o in outputs), [o.pdf_error for o in outputs]
    pipeline.write(outputs, out)
    return outputs, out


@pytest.mark.realstack
def test_pdf_first_page_is_not_blank(tools, pdf_report):
    outputs, out = pdf_report
    pdf = out / "gpufleet-report-2026-W47.pdf"
    assert pdf.read_bytes().startswith(b"%PDF-")
    subprocess.run([tools["pdftoppm"], "-r", "40", "-f", "1", "-l", "1", "-singlefile", str(pdf), str(out / "page1")], check=True, timeout=60)
    w, h, pixels = read_ppm(out / "page1.ppm")
    # A4 at 40 dpi is about 331 x 468
    assert 300 < w < 360 and 440 < h < 500 and h > w
    mean, var, dark = luminance_stats(pixels)
    assert var > 200, f"first page looks blank: luminance variance {var:.1f}"
    assert 0.005 < dark < 0.5, f"share of dark pixels {dark:.3f}: blank or a solid page"
    assert mean > 180  # a white page with text and charts, not a black one


@pytest.mark.realstack
def test_pdf_text_carries_the_figures_and_the_hostile_name_as_text(tools, store, pdf_report):  # noqa: F811
    outputs, out = pdf_report
    text = subprocess.run([tools["pdftotext"], "-layout", str(out / "gpufleet-report-2026-W47.pdf"), "-"],
                          check=True, capture_output=True, text=True, timeout=60).stdout
    w = week_window(2026, 47)
    t = Analysis(store.reader(), Params(w.start, w.end), now=NOW).totals()
    for v in (fmt.usd(t.idle_allocated_cost), fmt.hours(t.idle_allocated_gpu_h), fmt.pct(t.utilization_pct), fmt.hours(t.allocated_gpu_h)):
        assert v in text, v
    assert HOSTILE_JOB in text.replace("\n", "").replace(" ", "") or "<script>alert('x')" in text
    assert "GPU waste report 2026-W47" in text and "Method notes" in text
    team = subprocess.run([tools["pdftotext"], str(out / "gpufleet-report-2026-W47-team-physics.pdf"), "-"],
                          check=True, capture_output=True, text=True, timeout=60).stdout
    assert "team physics" in team and "bio" not in team


def test_missing_chromium_is_a_clear_error_and_html_is_still_written(store, tmp_path, caplog):  # noqa: F811
    with pytest.raises(PdfError, match=r"\[report\] chromium = 'no-such-browser': not found"):
        find_chromium("no-such-browser")
    from gpufleet.report import cli as report_cli

    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{store.root}"\n[report]\nchromium = "no-such-browser"\n')
    p = argparse.ArgumentParser()
    report_cli.add_arguments(p)
    rc = report_cli.run(p.parse_args(["--config", str(cfg), "--week", "2026-W47", "--out", str(tmp_path / "r"), "--quiet"]), out=io.StringIO())
    assert rc == 1
    assert "the PDF could not be made" in caplog.text
    assert sorted(x.suffix for x in (tmp_path / "r").iterdir()) == [".html", ".txt"]
