"""The dashboard's server process: Streamlit's own command line, once the pages' code is imported.

Streamlit runs a page's script in its server process when a browser first opens it, so the
modules the pages import (polars, DuckDB, altair, pandas for the tables' Styler, the analytics) were
imported by the first visitor's page: ~1.6 s of a 2-core host's CPU before that page computed
anything. Here they are imported before the server listens, as any server loads its code before
it serves. Which modules: every import statement of the router, its loaders and its pages (found
by reading their source, so a page's new import is preloaded without a list to keep), and those
the libraries import lazily at a page's first table or chart (ALSO; a test runs every page after
the preload and names any module a first visit still imports). Nothing is computed or read from
the store here: the pages' figures are theirs.

    python -m gpufleet.dashboards.serve run APP [streamlit options] -- [app arguments]

(`gpufleet dashboard` builds that command: dashboards/cli.py.)
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the router, its cached loaders and shared UI, and the pages: what a first visit runs
SOURCES = ("app.py", "data.py", "ui.py", "views/*.py")
# imported by what those call rather than by an import statement of theirs, at a first page's first table or chart: ui's
# tables (a polars frame's to_pandas, its pandas Styler with the Jinja templates it compiles at import, Streamlit's
# dataframe adapters), Altair's reading of a polars frame (narwhals), Streamlit's icons and script helpers
ALSO = ("pandas", "pandas.io.formats.style", "pyarrow.pandas_compat", "pyarrow.vendored.version", "narwhals._polars.dataframe",
        "narwhals._polars.namespace", "narwhals._interchange.dataframe", "narwhals._interchange.series", "narwhals._namespace",
        "narwhals.stable.v1._namespace", "streamlit.dataframe.lazy_df_adapters", "streamlit.material_icon_names",
        "streamlit.runtime.scriptrunner.magic_funcs", "streamlit.web.skills", "polars._utils.udfs")
OWN = "gpufleet.dashboards"


def page_imports(root: Path = HERE) -> list[str]:
    """The absolute module names imported anywhere in SOURCES (top level or inside functions), sorted."""
    names: set[str] = set()
    for pattern in SOURCES:
        for path in sorted(root.glob(pattern)):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
                    names.add(node.module)
                    # `from gpufleet.analytics import mfu`: mfu is a module of its own
                    names.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    return sorted(names)


def preload(names: list[str]) -> list[str]:
    """Import each of `names` that is a module (a `from X import name` of a function is not): the modules imported."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a module that is there but fails on an import of its own: the page would fail too
                raise
            continue
        done.append(name)
    return done


def skip_direct_run_check() -> bool:
    """Mark Streamlit's check for a script run without `streamlit run` as done; True if it was there.

    Streamlit makes it once per process, on the first element a page draws: inspect.stack(),
    which maps every frame to its module over every module loaded (~0.2 s of the first page the
    first visitor waits for). This process is `streamlit run` itself, so the check can only pass."""
    from streamlit import delta_generator

    if not hasattr(delta_generator, "_use_warning_has_been_displayed"):
        return False
    delta_generator._use_warning_has_been_displayed = True
    return True


def main(argv: list[str] | None = None) -> None:
    # the dashboards' own modules are the pages' to import: their st.cache_data loaders, made before
    # Streamlit's runtime exists, would each warn and keep a cache of their own (theirs is small code)
    preload([n for n in (*page_imports(), *ALSO) if not n.startswith(OWN)])
    skip_direct_run_check()
    from streamlit.web.cli import main as streamlit_main

    sys.argv = ["streamlit", *(sys.argv[1:] if argv is None else argv)]
    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
