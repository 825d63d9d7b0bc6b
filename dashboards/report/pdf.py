"""PDF from the report's own HTML, printed by headless Chromium (`--print-to-pdf`).

The HTML is self-contained, so Chromium runs with networking features off and a fresh, throwaway
profile; nothing is fetched. Debian's package is `chromium`.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class PdfError(Exception):
    """The PDF could not be made; the message says why and what to do."""


def find_chromium(configured: str = "") -> str:
    if configured:
        path = shutil.which(configured)
        if not path:
            raise PdfError(f"[report] chromium = {configured!r}: not found or not executable: expected a Chromium executable")
        return path
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise PdfError("no Chromium found for the PDF (looked for " + ", ".join(CANDIDATES) + "): install Debian's `chromium` "
                   "or set [report] chromium; the HTML and text reports are unaffected")


def html_to_pdf(html: str, out: Path, *, chromium: str = "", timeout: float = 120.0) -> Path:
    """Print `html` to the PDF file `out` (A4, the page size the HTML's @page asks for)."""
    exe = find_chromium(chromium)
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="gpufleet-report-") as tmp:
        src = Path(tmp) / "report.html"
        src.write_text(html, encoding="utf-8")
        target = Path(tmp) / "report.pdf"
        cmd = [
            exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--no-first-run", "--no-default-browser-check", "--mute-audio",
            f"--user-data-dir={Path(tmp) / 'profile'}", "--no-pdf-header-footer", "--print-to-pdf-no-header",
            f"--print-to-pdf={target}", src.as_uri(),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PdfError(f"{exe} did not print the PDF within {timeout:g} s") from None
        except OSError as e:
            raise PdfError(f"cannot run {exe}: {e}") from None
        if not target.exists() or target.stat().st_size == 0:
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-8:])
            raise PdfError(f"{exe} exited {proc.returncode} without a PDF:\n{tail}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(target), out)
    return out
