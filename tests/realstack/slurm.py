"""A real single-node Slurm with accounting and 8 fake GPUs, all on loopback, for the test suite.

Debian bookworm packages slurm-wlm (22.05.8), slurmdbd, munge and mariadb-server. Every daemon
runs as root in the foreground as our child, with its own port, socket, state and log under a
temp dir; nothing uses the system's /etc/slurm, /etc/munge, /var/lib/mysql or default ports, so
a machine's own Slurm (if any) is never touched:

  munged      own key, socket in a short 0755 dir under /tmp (munged insists that every user
              can reach its socket dir, and unix socket paths are limited to 108 bytes);
              slurm.conf AuthInfo= and AccountingStoragePass= and slurmdbd.conf AuthInfo= point
              Slurm's auth/munge, cred/munge and the slurmdbd connection at it
  mariadbd    fresh datadir (mariadb-install-db, <1 s), TCP on 127.0.0.1 only
  slurmdbd    slurmdbd.conf mode 600 owner root (with 644 slurmdbd dies: "fatal: ... should be 600")
  slurmctld   SlurmctldHost=<hostname -s>(127.0.0.1)
  slurmd      NodeName=<hostname -s> NodeAddr=127.0.0.1 Gres=gpu:h100:8

Fake GPUs: character devices nvidiaN (major 195, minor N) made with mknod and listed one per line
in gres.conf. Their minor numbers deliberately differ from their position
(DEFAULT_MINORS = 3,5,8,9,10,12,14,15), because the whole point is to see which of the two Slurm
reports. Slurm only stat()s them (task/none: no device cgroup), so no driver is needed. They live
in <workdir>/dev by default, not /dev: Slurm behaves identically (checked, see below), and a
private dir cannot collide with another test session running at the same time on the machine
(one session's teardown would delete the other's /dev nodes) nor with a GPU machine's real
/dev/nvidiaN. Pass device_dir="/dev" for the real place; existing identical nodes are then used
and never removed.

What Slurm 22.05.8 reports, observed on this harness (gres.conf File=/dev/nvidia3,5,8,9,10,12,14,15
in that order; job A --gres=gpu:3, then job B --gres=gpu:2 while A runs):

  scontrol show job -d   A: GRES=gpu:h100:3(IDX:0-2)      B: GRES=gpu:h100:2(IDX:3-4)
  SLURM_JOB_GPUS         A: 0,1,2   B: 3,4   (identical in the Prolog, the Epilog and the job)
  CUDA_VISIBLE_DEVICES   A: 0,1,2   B: 3,4   (same; also GPU_DEVICE_ORDINAL, ROCR_VISIBLE_DEVICES,
                                             ZE_AFFINITY_MASK; srun steps get SLURM_STEP_GPUS too)
  slurmd -G              "Index=3 ... File=/dev/nvidia3", "Index=5 ... File=/dev/nvidia5", ...

So every one of them is Slurm's GRES *index*: the device's position in gres.conf (0..7), not its
minor number (3..15), even though slurmd parses the minor from the file name. Job B's GPUs are
/dev/nvidia9 and /dev/nvidia10 (minors 9, 10), yet it is told "3,4" -- and "3" is the minor of a
different GPU. Same result with one range line File=/dev/nvidia[3,5,8-10,12,14-15], and with the
device nodes outside /dev. (With identity minors 0..7, as in most clusters, the two coincide,
which is how the confusion survives.) To name the physical GPU: index -> gres.conf File= (in
file order, as `slurmd -G` lists it) -> minor number -> NVML's minor number -> NVML index / UUID.
With task/cgroup ConstrainDevices=yes the job's CUDA_VISIBLE_DEVICES would be renumbered from 0
again (not exercised here: the harness uses task/none).

The Prolog's environment is minimal: no PATH, only SLURM_* and the GPU variables above
(SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION, SLURM_JOB_GPUS,
SLURM_SCRIPT_CONTEXT=prolog_slurmd, SLURM_CONF, ...). A prolog that exits non-zero drains the
node, which would break every later test in the session; hence the default prolog/epilog here is
a dispatcher that records the environment, runs the hooks a test installed (add_hook), logs their
exit status, and always exits 0.

Other things seen: right after slurmctld starts it waits ~3 s before its first scheduling pass
(jobs stay PENDING, Reason=None); later a job is allocated within ~0.1 s. sacct has a job's
record a moment after squeue stops listing it, so wait_job() polls sacct.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.realstack.debian import ensure_packages
from tests.realstack.policy import unavailable
from tests.realstack.process import (
    Daemon,
    HarnessError,
    base_env,
    free_port,
    kill_marked,
    run,
    wait_for,
)

log = logging.getLogger(__name__)

SLURM_PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server")
CLUSTER_NAME = "gpufleet"
DEFAULT_ACCOUNTS = ("physics", "biology")
# No minor equals its position, several equal another GPU's position: an index/minor mix-up shows.
DEFAULT_MINORS = (3, 5, 8, 9, 10, 12, 14, 15)
NVIDIA_MAJOR = 195
TERMINAL_STATES = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
        "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
    }
)
MARKER_KEY = "GPUFLEET_REALSTACK_SLURM"

_DB_PASSWORD = "gpufleet-test"
_live: "weakref.WeakSet[SlurmCluster]" = weakref.WeakSet()


@dataclass(frozen=True)
class FakeGpu:
    index: int  # Slurm's GRES index = position in gres.conf; what SLURM_JOB_GPUS and IDX: contain
    minor: int  # device minor number, the N of /dev/nvidiaN; what NVML calls the minor number
    path: str


def require_slurm() -> None:
    """Skip (or fail under CI=true) unless we can run a real Slurm here; install it if root."""
    if os.geteuid() != 0:
        unavailable(
            "needs root to install Debian packages slurm-wlm slurmdbd munge mariadb-server and to run "
            "slurmd/mknod fake GPU devices; run the tests as root or set up Slurm"
        )
    ensure_packages(*SLURM_PACKAGES)


def parse_idx(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (the list inside scontrol's GRES=gpu:type:N(IDX:...))."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


_DISPATCHER = """\
#!/bin/sh
# {kind} for the gpufleet test cluster (tests/realstack/slurm.py). Slurm gives a prolog no PATH.
PATH={path}; export PATH
job="${{SLURM_JOB_ID:-unknown}}"
env -0 > "{envdir}/{kind}.$job.env.tmp" && mv "{envdir}/{kind}.$job.env.tmp" "{envdir}/{kind}.$job.env"
for hook in "{hookdir}"/*; do
    [ -f "$hook" ] && [ -x "$hook" ] || continue
    "$hook" >> "{logdir}/{kind}-hooks.out" 2>&1
    echo "$job $(basename "$hook") $?" >> "{logdir}/{kind}-hooks.status"
done
# never non-zero: a failing prolog/epilog drains the node for every later test
exit 0
"""


class SlurmCluster:
    """Handle on a running single-node cluster; build it with start_slurm()."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        minors: Sequence[int] = DEFAULT_MINORS,
        gpu_type: str = "h100",
        accounts: Sequence[str] = DEFAULT_ACCOUNTS,
        users: Sequence[str] = ("root",),
        prolog: Path | str | None = None,
        epilog: Path | str | None = None,
        extra_conf: Iterable[str] = (),
        device_dir: Path | str | None = None,
        cpus: int | None = None,
        accounting_tres: str | None = "gres/gpu",
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.host = socket.gethostname().split(".")[0]
        self.gpu_type = gpu_type
        self.accounts = tuple(accounts)
        self.users = tuple(users)
        self.extra_conf = list(extra_conf)
        # AccountingStorageTRES beyond Slurm's defaults (cpu, mem, energy, node, billing, ...);
        # None: none, so slurmdbd records no GPU of any job (the common site the collector must read)
        self.accounting_tres = accounting_tres
        self.device_dir = Path(device_dir) if device_dir else self.workdir / "dev"
        # At least 8 CPUs so 8 one-GPU jobs can run at once on a 2-core VM (slurmd is told to
        # report the configured CPUs, SlurmdParameters=config_overrides).
        self.cpus = cpus or max(os.cpu_count() or 1, 8)
        self.gpus = [
            FakeGpu(index=i, minor=m, path=str(self.device_dir / f"nvidia{m}")) for i, m in enumerate(minors)
        ]

        self.etc = self.workdir / "etc"
        self.logs = self.workdir / "log"
        self.jobs_dir = self.workdir / "jobs"
        self.env_dir = self.workdir / "hook-env"  # what the dispatcher prolog/epilog recorded
        self.hook_dirs = {"prolog": self.workdir / "prolog.d", "epilog": self.workdir / "epilog.d"}
        self.slurm_conf = self.etc / "slurm.conf"
        self.gres_conf = self.etc / "gres.conf"
        self.slurmdbd_conf = self.etc / "slurmdbd.conf"
        self.prolog = Path(prolog) if prolog else self.etc / "prolog.sh"
        self.epilog = Path(epilog) if epilog else self.etc / "epilog.sh"
        self._own_prolog = prolog is None
        self._own_epilog = epilog is None

        self.run_dir: Path | None = None  # sockets and pid files: short path, made in start()
        self.ports: dict[str, int] = {}
        self.daemons: list[Daemon] = []
        self.created_devices: list[Path] = []
        self.startup_seconds: float | None = None
        self._marker = f"{MARKER_KEY}={self.workdir}"
        self._script_no = 0
        self._stopped = False

    # ---- what tests use -------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """Variables that point Slurm's commands at this cluster (merge into os.environ)."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    @property
    def minors(self) -> list[int]:
        return [g.minor for g in self.gpus]

    @property
    def device_files(self) -> list[str]:
        return [g.path for g in self.gpus]

    def command_env(self) -> dict[str, str]:
        # The marker rides into every job via sbatch's exported environment, so stop() can find
        # job processes that outlive slurmd.
        return base_env({**self.env, MARKER_KEY: str(self.workdir)})

    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> str:
        """Run a Slurm command against this cluster and return its stdout."""
        return run(argv, env=self.command_env(), timeout=timeout, check=check).stdout

    def sbatch(
        self,
        script_text: str,
        *,
        account: str | None = "physics",
        gpus: int | None = 1,
        extra_args: Sequence[str] = (),
    ) -> int:
        """Submit a batch script (a #!/bin/sh line is added if missing); returns the job id.

        Output goes to jobs/slurm-<id>.out (see job_output()); `gpus` becomes --gres=gpu:N.
        """
        if not script_text.startswith("#!"):
            script_text = "#!/bin/sh\n" + script_text
        self._script_no += 1
        script = self.jobs_dir / f"script-{self._script_no}.sh"
        script.write_text(script_text)
        args = [
            "sbatch",
            "--parsable",
            f"--chdir={self.jobs_dir}",
            f"--output={self.jobs_dir}/slurm-%j.out",
        ]
        if account:
            args.append(f"--account={account}")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        args += [*extra_args, str(script)]
        out = self.run(*args).strip()
        return int(out.split(";")[0].split("_")[0])

    def job_output(self, job_id: int) -> str:
        return (self.jobs_dir / f"slurm-{job_id}.out").read_text()

    def job_state(self, job_id: int) -> str | None:
        """squeue's state (PENDING, RUNNING, ...) or None once slurmctld no longer lists the job."""
        out = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).strip()
        return out.splitlines()[0] if out else None

    def wait_running(self, job_id: int, timeout: float = 30) -> None:
        def running() -> bool:
            state = self.job_state(job_id)
            if state is None or state in TERMINAL_STATES:
                raise HarnessError(f"job {job_id} ended ({self.sacct_states(job_id)}) before it was seen RUNNING")
            return state == "RUNNING"

        wait_for(f"job {job_id} RUNNING", running, timeout=timeout, daemons=self.daemons, interval=0.1)

    def sacct_states(self, job_id: int) -> list[str]:
        return [state for _, state in self.sacct_records(job_id)]

    def sacct_records(self, job_id: int) -> list[tuple[str, str]]:
        """(JobID, first word of State) of each allocation record accounting holds for the job."""
        out = self.sacct("-X", "-n", "-P", "-j", str(job_id), "-o", "JobID,State")
        return [(jid, state.split()[0]) for jid, state in (line.split("|", 1) for line in out.splitlines() if line.strip())]

    def wait_job(self, job_id: int, timeout: float = 60, *, array_tasks: int | None = None) -> str:
        """Wait until accounting shows the job (every task of an array) finished; return State.

        For an array pass `array_tasks` (how many it has): slurmdbd learns of the tasks that
        slurmctld split off the array record seconds after they ended (2-5 s measured on an idle
        machine), so until then sacct lists only the last task, or the array as a plain job id.
        For an array whose tasks ended differently the distinct states are joined with ','.
        """
        states: list[str] = []
        task = re.compile(rf"{job_id}_\d+")

        def finished() -> bool:
            nonlocal states
            if self.job_state(job_id) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return False
            records = self.sacct_records(job_id)
            if array_tasks is not None and sum(bool(task.fullmatch(jid)) for jid, _ in records) != array_tasks:
                return False
            states = [state for _, state in records]
            return bool(states) and all(s in TERMINAL_STATES for s in states)

        wait_for(f"job {job_id} to finish", finished, timeout=timeout, daemons=self.daemons, interval=0.2)
        return ",".join(dict.fromkeys(states))

    def scontrol_show_job_d(self, job_id: int) -> str:
        return self.run("scontrol", "show", "job", "-d", str(job_id))

    def gres_idx(self, job_id: int) -> list[int]:
        """The Slurm GPU indices of a running job, from `scontrol show job -d` (IDX:...)."""
        text = self.scontrol_show_job_d(job_id)
        m = re.search(r"GRES=gpu(?::[^:(\s]+)?:\d+\(IDX:([0-9,\-]+)\)", text)
        if not m:
            raise HarnessError(f"no GRES=gpu...(IDX:...) in scontrol show job -d {job_id}:\n{text}")
        return parse_idx(m.group(1))

    def sacct(self, *args: str) -> str:
        return self.run("sacct", *args)

    def sacctmgr(self, *args: str) -> str:
        return self.run("sacctmgr", "-i", *args)

    def scancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)

    def add_hook(self, kind: str, name: str, script_text: str) -> Path:
        """Install an executable that the dispatcher prolog/epilog runs for every job from now on.

        The hook inherits Slurm's prolog environment (SLURM_JOB_GPUS, ...) plus a PATH; its output
        is appended to log/<kind>-hooks.out and its exit status recorded (hook_status()).
        """
        if kind not in self.hook_dirs or not (self._own_prolog if kind == "prolog" else self._own_epilog):
            raise ValueError(f"no dispatcher {kind} in this cluster (custom {kind} given?)")
        if not script_text.startswith("#!"):
            script_text = "#!/bin/sh\n" + script_text
        path = self.hook_dirs[kind] / name
        path.write_text(script_text)
        path.chmod(0o755)
        return path

    def remove_hook(self, kind: str, name: str) -> None:
        (self.hook_dirs[kind] / name).unlink(missing_ok=True)

    def hook_status(self, job_id: int, kind: str = "prolog") -> dict[str, int]:
        """{hook name: exit status} for the hooks the dispatcher ran for `job_id`."""
        path = self.logs / f"{kind}-hooks.status"
        result = {}
        if path.exists():
            for line in path.read_text().splitlines():
                job, name, rc = line.split(" ")
                if job == str(job_id):
                    result[name] = int(rc)
        return result

    def hook_env(self, job_id: int, kind: str = "prolog", timeout: float = 15) -> dict[str, str]:
        """The environment Slurm gave the prolog (or epilog) of `job_id`, as the dispatcher saw it."""
        path = self.env_dir / f"{kind}.{job_id}.env"
        wait_for(f"{kind} environment of job {job_id} at {path}", path.exists, timeout=timeout, daemons=self.daemons)
        entries = path.read_bytes().decode(errors="replace").split("\0")
        return dict(e.split("=", 1) for e in entries if "=" in e)

    # ---- bring-up ---------------------------------------------------------------------------

    def start(self, timeout: float = 90) -> "SlurmCluster":
        t0 = time.monotonic()
        deadline = t0 + timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 1.0)

        for d in (self.etc, self.logs, self.jobs_dir, self.env_dir, self.device_dir, *self.hook_dirs.values()):
            d.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(tempfile.mkdtemp(prefix="gfslurm-", dir="/tmp"))
        self.run_dir.chmod(0o755)
        self.ports = {name: free_port() for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd")}
        _live.add(self)

        self._create_devices()
        self._start_munge(left())
        self._start_mariadb(left())
        self._write_configs()
        self._start_slurmdbd(left())
        self._register_accounts()
        self._start_slurm(left())
        self.startup_seconds = time.monotonic() - t0
        log.info("Slurm cluster up in %.1fs (%s)", self.startup_seconds, self.workdir)
        return self

    def _daemon(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(name, argv, self.logs / f"{name}.out", env=env or self.command_env(), cwd=self.workdir)
        self.daemons.append(d)
        return d.start()

    def _create_devices(self) -> None:
        for gpu in self.gpus:
            path = Path(gpu.path)
            if os.path.lexists(path):
                st = os.lstat(path)
                if not (
                    stat.S_ISCHR(st.st_mode)
                    and os.major(st.st_rdev) == NVIDIA_MAJOR
                    and os.minor(st.st_rdev) == gpu.minor
                ):
                    raise HarnessError(f"{path} exists and is not char device {NVIDIA_MAJOR}:{gpu.minor}")
                continue  # a real (or leftover) identical node: use it, never remove it
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, gpu.minor))
            self.created_devices.append(path)

    @property
    def munge_socket(self) -> Path:
        assert self.run_dir
        return self.run_dir / "munge.socket"

    def _start_munge(self, timeout: float) -> None:
        key_dir = self.workdir / "munge"
        key_dir.mkdir(mode=0o700, exist_ok=True)
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d = self._daemon(
            "munged",
            [
                "munged", "--foreground", "--num-threads=10",
                f"--key-file={key}", f"--socket={self.munge_socket}",
                f"--pid-file={self.run_dir}/munged.pid", f"--log-file={self.logs}/munged.log",
                f"--seed-file={key_dir}/munged.seed",
            ],
        )
        wait_for(
            "munged to answer",
            lambda: run(["munge", "-n", "-S", str(self.munge_socket)], env=self.command_env(), check=False).returncode == 0,
            timeout=timeout,
            daemons=[d],
        )

    def _start_mariadb(self, timeout: float) -> None:
        datadir = self.workdir / "mariadb"
        run(
            [
                "mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db",
            ],
            env=self.command_env(),
            timeout=timeout,
        )
        sock = self.run_dir / "mysqld.sock"
        d = self._daemon(
            "mariadbd",
            [
                "mariadbd", "--no-defaults", f"--datadir={datadir}", "--user=root",
                "--bind-address=127.0.0.1", f"--port={self.ports['mariadb']}", f"--socket={sock}",
                f"--pid-file={self.run_dir}/mysqld.pid", f"--log-error={self.logs}/mariadbd.log",
                "--skip-name-resolve", "--skip-log-bin",
                # throwaway data: trade durability for speed; lock timeout as slurmdbd recommends
                "--innodb-buffer-pool-size=128M", "--innodb-lock-wait-timeout=900",
                "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
            ],
        )
        admin = ["mariadb-admin", "--no-defaults", f"--socket={sock}", "-uroot"]
        wait_for(
            "mariadbd to answer ping",
            lambda: run([*admin, "ping"], env=self.command_env(), check=False).returncode == 0,
            timeout=timeout,
            daemons=[d],
        )
        sql = (
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{_DB_PASSWORD}';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
            "FLUSH PRIVILEGES;"
        )
        run(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", sql], env=self.command_env())

    def _write_configs(self) -> None:
        run_dir, logs = self.run_dir, self.logs
        self.slurmdbd_conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.ports['slurmdbd']}",
                    "SlurmUser=root",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['mariadb']}",
                    "StorageUser=slurm",
                    f"StoragePass={_DB_PASSWORD}",
                    "StorageLoc=slurm_acct_db",
                    f"PidFile={run_dir}/slurmdbd.pid",
                    f"LogFile={logs}/slurmdbd.log",
                    "DebugLevel=info",
                    "",
                ]
            )
        )
        os.chown(self.slurmdbd_conf, 0, 0)
        self.slurmdbd_conf.chmod(0o600)  # slurmdbd is fatal on a config others can read (password)

        self.gres_conf.write_text(
            "".join(
                f"NodeName={self.host} Name=gpu Type={self.gpu_type} File={g.path}\n" for g in self.gpus
            )
        )
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.workdir}/state",
            f"SlurmdSpoolDir={self.workdir}/spool",
            f"SlurmctldPidFile={run_dir}/slurmctld.pid",
            f"SlurmdPidFile={run_dir}/slurmd.pid",
            f"SlurmctldLogFile={logs}/slurmctld.log",
            f"SlurmdLogFile={logs}/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "PriorityType=priority/multifactor",
            "GresTypes=gpu",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['slurmdbd']}",
            f"AccountingStoragePass={self.munge_socket}",  # the munge socket for slurmdbd traffic
            *([f"AccountingStorageTRES={self.accounting_tres}"] if self.accounting_tres else []),
            "AccountingStorageEnforce=associations",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "KillWait=2",
            "PrologEpilogTimeout=60",
            f"Prolog={self.prolog}",
            f"Epilog={self.epilog}",
            "PrologFlags=Alloc",
            *self.extra_conf,
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 "
            f"Gres=gpu:{self.gpu_type}:{len(self.gpus)} State=UNKNOWN",
            f"PartitionName=main Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
        self.slurm_conf.write_text("\n".join(lines))
        for kind, script, own in (("prolog", self.prolog, self._own_prolog), ("epilog", self.epilog, self._own_epilog)):
            if own:
                script.write_text(
                    _DISPATCHER.format(
                        kind=kind,
                        path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        envdir=self.env_dir,
                        hookdir=self.hook_dirs[kind],
                        logdir=self.logs,
                    )
                )
                script.chmod(0o755)

    def _start_slurmdbd(self, timeout: float) -> None:
        d = self._daemon("slurmdbd", ["slurmdbd", "-D"])
        wait_for(
            "slurmdbd to answer sacctmgr",
            lambda: run(["sacctmgr", "-n", "list", "cluster"], env=self.command_env(), check=False, timeout=10).returncode == 0,
            timeout=timeout,
            daemons=[d],
            interval=0.2,
        )

    def _register_accounts(self) -> None:
        self.sacctmgr("add", "cluster", CLUSTER_NAME)
        if self.accounts:
            self.sacctmgr("add", "account", ",".join(self.accounts), f"cluster={CLUSTER_NAME}")
            for user in self.users:
                self.sacctmgr("add", "user", user, f"account={','.join(self.accounts)}", f"cluster={CLUSTER_NAME}")

    def _start_slurm(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ctld = self._daemon("slurmctld", ["slurmctld", "-D"])
        slurmd = self._daemon("slurmd", ["slurmd", "-D"])

        def node_idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-n", self.host, "-o", "%T", check=False).strip()
            if out in ("drained", "inval", "down", "drained*", "down*") and time.monotonic() > deadline - 5:
                raise HarnessError(f"node {self.host} is {out}: {self.run('scontrol', 'show', 'node', check=False)}")
            return out == "idle"

        wait_for(f"node {self.host} idle in sinfo", node_idle, timeout=timeout, daemons=[ctld, slurmd], interval=0.2)

        def registered() -> bool:
            out = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster,ControlHost,ControlPort", check=False)
            return f"{CLUSTER_NAME}|127.0.0.1|{self.ports['slurmctld']}" in out.splitlines()

        wait_for(
            "slurmctld registered with slurmdbd (sacctmgr list cluster)",
            registered,
            timeout=max(deadline - time.monotonic(), 5),
            daemons=self.daemons,
            interval=0.2,
        )

    # ---- teardown ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every daemon and job process this cluster started; remove the device nodes it made.

        Safe to call twice and after a failed start. The workdir (configs, logs) stays for
        post-mortems; the database files and the /tmp run dir go.
        """
        if self._stopped:
            return
        self._stopped = True
        by_name = {d.name: d for d in self.daemons}
        if by_name.get("slurmctld") and by_name["slurmctld"].alive():
            try:
                self.scancel_all()
            except Exception as exc:  # noqa: BLE001 -- best effort, daemons are killed below anyway
                log.warning("scancel during stop failed: %s", exc)
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            if name in by_name:
                by_name[name].stop(timeout=15)
        killed = kill_marked(self._marker)
        if killed:
            log.info("killed leftover job/step processes %s", killed)
        still = [f"{d.name}({d.pid})" for d in self.daemons if d.alive()]
        if still:
            log.error("daemons still alive after stop: %s", still)
        for path in self.created_devices:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        self.created_devices.clear()
        shutil.rmtree(self.workdir / "mariadb", ignore_errors=True)
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        _live.discard(self)

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_slurm(workdir: Path | str, *, timeout: float = 90, **options) -> SlurmCluster:
    """Install (if root and needed) and start a cluster; see SlurmCluster for `options`.

    If bring-up fails, whatever was started is stopped before the error propagates.
    """
    require_slurm()
    cluster = SlurmCluster(workdir, **options)
    try:
        cluster.start(timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if a session ends without its fixture teardown (e.g. an internal error)."""
    for cluster in list(_live):
        cluster.stop()
