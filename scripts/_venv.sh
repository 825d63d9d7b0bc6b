# Sourced by the scripts: make .venv with the project installed (extras in $1), once per pyproject change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${1:-all}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "gpufleet needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
STAMP="$VENV/.gpufleet-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
    # setuptools warns on every editable install that a folder named like the package (gpufleet/)
    # may take precedence: here that folder IS the package's root, so the notice is only noise.
    # --no-compile: the scripts keep bytecode under PYTHONPYCACHEPREFIX (below), where Python looks
    # instead of __pycache__, so pip's byte-compiling of every installed module was never read
    # (7 s of a fresh set-up's 39 s here, 11 s of CPU); modules are compiled there when first imported.
    PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
        "$VENV/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check -e "$ROOT[$EXTRAS]"
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# Python's bytecode (and pytest's assertion-rewritten test modules) cached in the venv, out of the
# tree, even where the environment says PYTHONDONTWRITEBYTECODE: without a cache every process
# (each test worker, each CLI a test or the demo starts) compiles the project again - 8 s of CPU per
# test worker, 2.5 s with it.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$VENV/pycache}"
unset PYTHONDONTWRITEBYTECODE
