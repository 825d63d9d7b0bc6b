"""Install the Debian packages that provide the real components, when we are root.

The packages ship daemons whose maintainer scripts would start system services (mariadb on :3306,
munged, slurmd, prometheus on :9090) during the install; the tests start their own copies on
loopback with their own ports and data, so a policy-rc.d that answers 101 ("action forbidden")
keeps the system ones from starting. A policy-rc.d that was already there (container images ship
one) is left exactly as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from tests.realstack.policy import unavailable
from tests.realstack.process import SBIN_PATH, HarnessError

log = logging.getLogger(__name__)

# A binary each package provides: cheaper and more telling than asking dpkg ("is the tool there").
PACKAGE_BINARIES = {
    "prometheus": "prometheus",
    "prometheus-alertmanager": "amtool",  # Debian names the daemon prometheus-alertmanager
    "slurm-wlm": "slurmctld",
    "slurmd": "slurmd",
    "slurmctld": "slurmctld",
    "slurm-client": "sbatch",
    "slurmdbd": "slurmdbd",
    "munge": "munged",
    "mariadb-server": "mariadbd",
    "mariadb-client": "mariadb",
}

POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
APT_OPTS = ["-o", "DPkg::Lock::Timeout=300"]  # wait for a concurrent apt/dpkg instead of failing
_apt_updated = False


def which(binary: str) -> str | None:
    """shutil.which with sbin on the search path (non-root PATHs often lack it)."""
    return shutil.which(binary, path=f"{os.environ.get('PATH', '')}:{SBIN_PATH}")


def _installed(package: str) -> bool:
    binary = PACKAGE_BINARIES.get(package)
    if binary:
        return which(binary) is not None
    if not which("dpkg-query"):
        return False
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def missing_packages(names: Iterable[str]) -> list[str]:
    return [n for n in names if not _installed(n)]


@contextmanager
def _services_held_back():
    """policy-rc.d answering 101 for the duration, unless one is already in place."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\n# written by gpufleet tests/realstack/debian.py during an install\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)


def _apt(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log.info("running apt-get %s", " ".join(args))
    try:
        return subprocess.run(
            ["apt-get", *APT_OPTS, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"apt-get {' '.join(args)} timed out after {timeout}s") from exc


def _apt_update() -> None:
    global _apt_updated
    proc = _apt(["update", "-q"], timeout=600)
    if proc.returncode != 0:
        raise HarnessError(f"apt-get update failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    _apt_updated = True


def _lists_present() -> bool:
    lists = Path("/var/lib/apt/lists")
    return any(p.name.endswith("_Packages") or "_Packages." in p.name for p in lists.glob("*Packages*"))


def _stale_lists(stderr: str) -> bool:
    """apt's messages when its package lists are missing or out of date."""
    return any(
        s in stderr
        for s in ("Unable to locate package", "has no installation candidate", "404", "Unable to fetch")
    )


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure_packages(*names: str) -> None:
    """Make sure the Debian packages `names` are installed, installing them as root if needed.

    Not root and something is missing -> unavailable() (skip, or fail under CI=true).
    The install fails -> HarnessError with the tail of apt's stderr.
    """
    missing = missing_packages(names)
    if not missing:
        return
    pkgs = " ".join(missing)
    if os.geteuid() != 0:
        unavailable(f"needs root to install Debian package(s) {pkgs}; run as root or install them")
    if not which("apt-get"):
        unavailable(f"Debian package(s) {pkgs} are missing and this machine has no apt-get")

    install = ["install", "-y", "-q", "--no-install-recommends", *missing]
    with _services_held_back():
        if not _apt_updated and not _lists_present():
            _apt_update()
        proc = _apt(install, timeout=900)
        if proc.returncode != 0 and not _apt_updated and _stale_lists(proc.stderr):
            _apt_update()
            proc = _apt(install, timeout=900)
    if proc.returncode != 0:
        raise HarnessError(f"apt-get install {pkgs} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    still = missing_packages(missing)
    if still:
        raise HarnessError(f"apt-get installed {pkgs} but these still look missing: {' '.join(still)}")
    log.info("installed Debian packages: %s", pkgs)
