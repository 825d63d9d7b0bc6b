"""Is a dashboard (streamlit) serving? For the tests that start one."""

from __future__ import annotations

import urllib.request


def dashboard_healthy(port: int, timeout: float = 2) -> bool:
    """Streamlit's health endpoint on loopback answers "ok"; refused or timed out: not (yet)."""
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=timeout).read() == b"ok"
    except OSError:
        return False
