"""The one TOML configuration file: each package owns a section and declares its options here.

Validation happens at start and every error names the key, the value and what was expected, so
an operator can fix a typo without reading code.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")

# The file's top-level tables, each owned by one package; anything else is a typo to report.
SECTIONS = ("exporter", "collector", "analytics", "dashboard", "report", "policy")


class ConfigError(Exception):
    """A configuration value is wrong. Each problem says where, what and what was expected; one
    error carries every problem found, so an operator fixes the file in one pass."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


USAGE = 2  # the exit status of bad usage or configuration (contract 5); 1 is a runtime failure


def command_error(command: str, error: Exception | str, status: int = USAGE) -> int:
    """Say a command's error to its user as plain lines on stderr - "gpufleet analyze: error: ...",
    argparse's form, each problem on a line of its own - not as log records; returns `status`
    (the exit status: bad usage or configuration unless told otherwise)."""
    problems = error.problems if isinstance(error, ConfigError) else (str(error),)
    for problem in problems:
        sys.stderr.write(f"gpufleet {command}: error: {problem}\n")
    return status


def gather(*steps: Callable[[], T]) -> list[T]:
    """Run every validation step and raise one ConfigError with all their problems (not only the
    first); otherwise return their results in order."""
    results: list[Any] = []
    problems: list[str] = []
    for step in steps:
        try:
            results.append(step())
        except ConfigError as e:
            problems.extend(e.problems)
            results.append(None)
    if problems:
        raise ConfigError(*problems)
    return results


@dataclass(frozen=True)
class Option:
    key: str
    default: Any
    expected: str  # human description, e.g. "a number of seconds > 0"
    check: Callable[[Any], bool]


def number(minimum: float = 0.0, *, inclusive: bool = False) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return v >= minimum if inclusive else v > minimum

    return check


def integer(minimum: int = 0) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def string(v: Any) -> bool:
    return isinstance(v, str)


def strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def table(v: Any) -> bool:
    return isinstance(v, dict)


def boolean(v: Any) -> bool:
    return isinstance(v, bool)


def one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda v: v in choices


def host_port(v: Any) -> bool:
    """'HOST:PORT' or ':PORT' with a port in 0..65535 (0 picks a free port)."""
    if not isinstance(v, str) or ":" not in v:
        return False
    port = v.rsplit(":", 1)[1]
    return port.isdigit() and 0 <= int(port) <= 65535


def load_file(path: str | Path | None, what: str = "config file") -> dict[str, Any]:
    """Parse a TOML file; None means "no file" (all defaults)."""
    if path is None:
        return {}
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} not found: expected a TOML file path") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {p} is not valid TOML: {e}") from None


def load_config(path: str | Path | None) -> dict[str, Any]:
    """The configuration file (None: all defaults), with its top-level tables checked against
    SECTIONS, so a misspelt `[analytic]` is an error instead of silently ignored settings."""
    doc = load_file(path)
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        known = ", ".join(f"[{name}]" for name in SECTIONS)
        raise ConfigError(*(f"config {path}: unknown section [{name}]: expected one of {known}" for name in unknown))
    return doc


def validate(
    values: Mapping[str, Any],
    options: Sequence[Option],
    where: str,
) -> dict[str, Any]:
    """Check `values` against `options`, fill defaults, and reject unknown keys.

    `where` names the place for messages, e.g. "config /etc/gpufleet.toml [exporter]".
    """
    known = {o.key: o for o in options}
    problems = [f"{where}: unknown key {key!r}: expected one of {', '.join(sorted(known))}"
                for key in sorted(set(values) - set(known))]
    out: dict[str, Any] = {}
    for opt in options:
        if opt.key not in values:
            out[opt.key] = opt.default
            continue
        value = values[opt.key]
        if not opt.check(value):
            problems.append(f"{where}: {opt.key} = {value!r}: expected {opt.expected}")
        out[opt.key] = value
    if problems:
        raise ConfigError(*problems)
    return out


def section(doc: Mapping[str, Any], name: str, options: Sequence[Option], path: Any, parent: str = "") -> dict[str, Any]:
    """Validate one package's section of the loaded file (`parent` names an enclosing table)."""
    raw = doc.get(name, {})
    where = f"config {path or '(defaults)'} [{parent + '.' if parent else ''}{name}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table, got {raw!r}")
    return validate(raw, options, where)
