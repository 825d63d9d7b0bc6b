"""scripts/screenshots: every dashboard page of the demo's backfilled week (tests/support/demo_site.py),
shot at 1,600 px wide by a headless Chromium into docs/screenshots/<page>.png, plus a job's page.
Re-run it after changing a page; the README's dashboards section shows the PNGs."""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from tests.support.browser import Browser
from tests.support.demo_site import PAGES, build, serve

WIDTH = 1600
ROOT = Path(__file__).resolve().parents[2]


def small(path: Path) -> None:
    """A page has few colours: 256 of them keep it as it looks at a third of the bytes (the PNGs are committed)."""
    from PIL import Image

    with Image.open(path) as im:
        im.convert("RGB").quantize(colors=256).save(path, optimize=True)


def main(argv: list[str]) -> int:
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import open_reader
    from gpufleet.times import utcnow

    out = Path(argv[0]) if argv else ROOT / "docs" / "screenshots"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        print("screenshots: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufleet-shots-") as tmp:
        workdir = Path(tmp)
        now = utcnow().replace(microsecond=0)
        print("backfilling the demo's week ...", file=sys.stderr)
        fleet = build(workdir, now)
        a = Analysis(open_reader(workdir / "store"), Params(start=now - timedelta(days=1), end=now), now=now)
        job = a.top_wasteful_jobs(1)["job_id"][0]
        pages = [(n, p) for n, p, _ in PAGES if n != "home"] + [("job", f"/jobs?job={job}")]
        with serve(workdir, fleet) as url, Browser(binary, workdir, width=WIDTH) as browser:
            for name, path in pages:
                browser.load(url + path, timeout=240)
                browser.settle()
                browser.screenshot(out / f"{name}.png")
                small(out / f"{name}.png")
                print(f"{out / name}.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
