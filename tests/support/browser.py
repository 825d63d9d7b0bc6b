"""A minimal DevTools-protocol client for a headless Chromium: open a Streamlit page, wait until it
has finished running, screenshot it, and read what it shows (table cells from the data grid's
accessibility table, chart labels and marks from Vega's SVG). Used by the dashboard's browser tests
and by scripts/screenshots.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import urllib.request
from pathlib import Path

from tests.realstack.process import Daemon, HarnessError, wait_for

# Every cell of every table the page shows (the grid's accessibility table holds the rows on screen),
# keyed by the table's container key (ui.table's `key`: st-key-<key>)
TABLE_CELLS_JS = """(() => { const out = {};
    document.querySelectorAll('[class*="st-key-"]').forEach(box => {
        const key = Array.from(box.classList).find(c => c.startsWith('st-key-'));
        const cells = Array.from(box.querySelectorAll('td[role="gridcell"]')).map(td => td.innerText.trim());
        const heads = Array.from(box.querySelectorAll('th[role="columnheader"]')).map(th => th.innerText.trim());
        if (cells.length || heads.length) out[key.slice(7)] = {cells: cells, headers: heads};
    });
    return out; })()"""

# Per Vega chart (in page order): its visible axis and legend labels, and its marks' ARIA descriptions
CHARTS_JS = """Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] svg, .vega-embed svg'))
    .filter((svg, i, all) => all.indexOf(svg) === i)
    .map(svg => {
        const shown = sel => Array.from(svg.querySelectorAll(sel)).filter(t => t.getAttribute('opacity') !== '0'
            && getComputedStyle(t).opacity !== '0').map(t => t.textContent);
        return {
            x: shown('.role-axis[aria-label^="X"] .role-axis-label text'),
            y: shown('.role-axis[aria-label^="Y"] .role-axis-label text'),
            legend: shown('.role-legend-label text'),
            marks: Array.from(svg.querySelectorAll('.role-mark [aria-label], .role-mark path[aria-label], .role-mark rect[aria-label]'))
                .slice(0, 4000).map(e => e.getAttribute('aria-label')),
        }; })"""


class Browser:
    def __init__(self, binary: str, workdir: Path, width: int = 1400):
        self.width = width
        self.profile = workdir / "chromium-profile"
        self.daemon = Daemon("chromium", [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                          "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={self.profile}",
                                          "--remote-debugging-port=0", f"--window-size={width},1000", "about:blank"],
                             # its temporary files in the caller's directory: a Chromium stopped by a signal leaves its
                             # process-singleton directory (org.chromium.Chromium.*) behind, one a browser, in TMPDIR
                             workdir / "chromium.log", env={**os.environ, "TMPDIR": str(workdir)})
        self.ws = None
        self._stack = contextlib.ExitStack()
        self._id = 0

    def __enter__(self) -> "Browser":
        from websockets.sync.client import connect

        self.daemon.start()
        active = self.profile / "DevToolsActivePort"
        wait_for("chromium's DevTools port", lambda: active.exists() and len(active.read_text().splitlines()) >= 2, timeout=60,
                 daemons=[self.daemon])
        port = int(active.read_text().splitlines()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.ws = self._stack.enter_context(connect(url, max_size=None, open_timeout=30))
        self.call("Page.enable")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._stack.close()
        finally:
            self.daemon.stop()

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise HarnessError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def load(self, url: str, timeout: float = 300) -> float:
        """Open `url`; return the seconds until Streamlit is connected, done running and shows a title.
        The deadline is generous (polled): under the full run a page's first draw took over 90 s once;
        how fast pages draw is the bench's to measure, not this harness'."""
        t0 = time.monotonic()
        self.call("Page.navigate", url=url)
        time.sleep(1.0)  # (Page.navigate returns before the new document has replaced the old one)
        ready = """(() => { const a = document.querySelector('[data-testid="stApp"]');
            return !!a && a.getAttribute('data-test-connection-state') === 'CONNECTED'
                && a.getAttribute('data-test-script-state') === 'notRunning'
                && !document.querySelector('[data-testid="stAppSkeleton"]') && !!document.querySelector('h1'); })()"""
        wait_for(f"{url} to render", lambda: bool(self.js(ready)), timeout=timeout, interval=0.2)
        return time.monotonic() - t0

    def screenshot(self, path: Path) -> None:
        time.sleep(1.0)  # charts and tables lay out after the script has run: measure the page once they have
        height = self.js("""Math.max(document.documentElement.scrollHeight,
            ...Array.from(document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"], [data-testid="stMainBlockContainer"]'))
               .map(e => e.scrollHeight))""")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=max(800, min(int(height or 1000) + 40, 10000)),
                  deviceScaleFactor=1, mobile=False)
        time.sleep(1.0)  # charts re-layout to the new size
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        self.call("Emulation.clearDeviceMetricsOverride")

    def dom(self) -> str:
        return self.js("document.documentElement.outerHTML")

    def settle(self, timeout: float = 60) -> None:
        """Wait until the page has stopped changing and every chart of it is drawn (the data grid
        and Vega draw after Streamlit's script has run; right after a navigation the old page may
        still be there)."""
        state = """(() => { const a = document.querySelector('[data-testid="stApp"]');
            if (!a || a.getAttribute('data-test-script-state') !== 'notRunning' || !document.querySelector('h1')
                || document.querySelector('[data-testid="stSkeleton"]')) return -1;  // (a chart or table whose code is loading)
            const boxes = document.querySelectorAll('[data-testid="stVegaLiteChart"]');
            const drawn = Array.from(boxes).every(b => b.querySelector('svg .role-axis, canvas'));
            const n = document.querySelectorAll('[data-testid="stMain"] *').length;
            return drawn && n > 0 ? n : -1; })()"""
        seen = [-2]

        def still() -> bool:
            time.sleep(1.0)
            now = self.js(state)
            done = now is not None and now > 0 and now == seen[0]
            seen[0] = now
            return done

        wait_for("the page to settle with its charts drawn", still, timeout=timeout, interval=0.1)

    def tables(self) -> dict:
        return self.js(TABLE_CELLS_JS) or {}

    def charts(self) -> list[dict]:
        return self.js(CHARTS_JS) or []
