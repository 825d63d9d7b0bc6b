"""The TOML the idle-GPU policy tests share: mail through a local SMTP server, and a [policy]
section built from the values each test sets (one place, so the tests differ only in those)."""

from __future__ import annotations


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"'


def policy_toml(smtp_port: int, **policy) -> str:
    """[report] mailing through 127.0.0.1:`smtp_port`, then [policy] with `policy`'s keys."""
    lines = "".join(f"{key} = {_toml(value)}\n" for key, value in policy.items())
    return f"""[report]
from_address = "gpufleet@example.org"
[report.smtp]
host = "127.0.0.1"
port = {smtp_port}
timeout = 5
[policy]
{lines}"""
