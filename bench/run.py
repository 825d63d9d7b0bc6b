"""Run the benchmarks and print one results table per benchmark.

    python -m bench.run              # every benchmark module in bench/
    python -m bench.run exporter     # only those named
    python -m bench.run --list

A benchmark module is any `bench/<name>.py` not starting with `_` that defines
`run() -> list[bench._common.Table]`. Progress goes to stderr, tables to stdout.
Exit status: 0 all goals met, 1 a goal missed or a benchmark crashed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import time
import traceback
from pathlib import Path

from bench._common import Table, progress, stop_all_children

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.name.startswith("_") and m.name != "run")


def _terminate(signum: int, _frame: object) -> None:
    # turn SIGTERM/SIGHUP into an exception so every `finally` runs and no child is left behind
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    names = available()
    p = argparse.ArgumentParser(prog="python -m bench.run", description="Run gpufleet benchmarks and print results tables.")
    p.add_argument("benchmarks", nargs="*", metavar="NAME", help=f"benchmark modules to run (default: all of {', '.join(names)})")
    p.add_argument("--list", action="store_true", help="list benchmark modules and exit")
    args = p.parse_args(argv)
    if args.list:
        for n in names:
            doc = (importlib.import_module(f"bench.{n}").__doc__ or "").strip().splitlines()
            print(f"{n:12} {doc[0] if doc else ''}")
        return 0
    chosen = args.benchmarks or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}: expected one of {', '.join(names)}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)

    failed = False
    started = time.monotonic()
    try:
        for name in chosen:
            progress(f"running {name}")
            t0 = time.monotonic()
            try:
                tables: list[Table] = importlib.import_module(f"bench.{name}").run()
            except Exception:  # noqa: BLE001 - report and go on with the next benchmark
                traceback.print_exc()
                print(f"== {name} ==\nCRASHED (traceback on stderr)\n", flush=True)
                failed = True
                continue
            finally:
                stop_all_children()
            for t in tables:
                print(t.render() + "\n", flush=True)
                failed |= t.failed
            progress(f"{name} took {time.monotonic() - t0:.0f} s")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop_all_children()
    progress(f"all done in {time.monotonic() - started:.0f} s: {'some goal missed' if failed else 'all goals met'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
