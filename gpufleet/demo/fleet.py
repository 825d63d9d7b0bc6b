"""The demo's simulated fleet: hardware, tenants, and a week-plus of planned work.

Two clusters that look like real ones:

- `hpc`, Slurm: 16 nodes x 8 H100. Partitions `train` (nodes 01-06: 8- and 16-GPU training),
  `batch` (07-12: 2- and 4-GPU jobs) and `interactive` (13-16: 1-GPU notebooks and dev shells).
  Six accounts with entitled shares.
- `k8s`, Kubernetes: 8 nodes x 4 A100 80GB. Namespaces for production inference (a daily
  cycle), recommender training, research, and notebooks; node 07 splits its GPUs into 3g.40gb
  MIG slices and node 08 two of its GPUs into 1g.10gb slices.

The plan is a list of jobs laid out lane by lane (a lane = the GPUs one job takes), each with a
load profile (analytics never sees the profile: it sees only what exporters would publish).
One GPU throws XIDs and falls off the bus three hours before "now"; a few training jobs of the
last day lose their first attempt to an XID (79, 48, 94) on one GPU and are requeued
(_plan_failures); one batch node is a lemon whose jobs lose attempts that way all week
(_plan_lemon); one k8s node's exporter is down for two hours. Everything is deterministic for a given `now` and seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from gpufleet.exporter.backends import sim

STEP_S = 15  # the exporters' scrape interval
HISTORY = timedelta(days=7)
AHEAD = timedelta(hours=36)  # the plan runs on past "now", so live jobs start and end

PROFILES = ("idle", "train", "stalled", "held", "notebook", "inference", "dev",
            # training jobs that lose their time one way each (gpufleet.analytics.states): a 20-minute
            # model load, a data loader that starves the GPU, all-reduce-heavy with low tensor
            # activity, one straggler GPU, checkpoints every 30 minutes costing 90 s (load.py)
            "loading", "starved", "allreduce", "straggler", "checkpoint")
PROFILE_CODE = {p: i for i, p in enumerate(PROFILES)}
# every PATTERN_EVERY-th multi-GPU Slurm training job (in submission order) shows one of these
PATTERNS = PROFILES[7:]
PATTERN_EVERY = 3


@dataclass(frozen=True)
class Node:
    cluster: str
    host: str
    model: str  # an NVML model name known to gpufleet.exporter.backends.sim_models
    gpus: int
    mig: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU index -> MIG profiles
    partition: str = ""


@dataclass(frozen=True)
class Slot:
    """One schedulable device: a whole GPU, or a MIG instance (gpu_instance = GPU_I_ID)."""

    node: Node
    gpu: int
    gpu_instance: int | None = None
    mig_profile: str | None = None

    @property
    def gpu_uuid(self) -> str:
        return sim.gpu_uuid(self.node.host, self.gpu)

    @property
    def mig_uuid(self) -> str | None:
        return None if self.gpu_instance is None else sim.mig_uuid(self.node.host, self.gpu, self.gpu_instance - 1)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.node.host, self.gpu, self.gpu_instance or 0)


@dataclass(frozen=True)
class Job:
    cluster: str
    scheduler: str  # slurm | kubernetes
    job_key: str  # slurm: the job id; kubernetes: namespace/pod
    job_id: str
    name: str
    user: str
    account: str  # slurm account; kubernetes: the team label
    partition: str  # slurm partition; kubernetes: the namespace
    profile: str
    slots: tuple[Slot, ...]
    submit: datetime
    start: datetime
    end: datetime  # planned end (the job may still be running at "now")
    final_state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL
    params: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # profile shape, see load.py
    seed: int = 0
    requeue: Requeue | None = None  # a hardware failure ended its first attempt; Slurm requeued it

    def state_at(self, now: datetime) -> str | None:
        """The scheduler's view at `now`: None before submission."""
        if now < self.submit:
            return None
        if now < self.start:
            return "PENDING"
        if self.requeue and self.requeue.failed_at <= now < self.requeue.restarted_at:
            return "PENDING"  # back in the queue after the failure
        if now < self.end:
            return "RUNNING"
        return self.final_state

    def started_at(self, now: datetime) -> datetime:
        """The start of the attempt the scheduler reports at `now` (a requeue starts a new one)."""
        return self.requeue.restarted_at if self.requeue and now >= self.requeue.restarted_at else self.start


@dataclass(frozen=True)
class Requeue:
    """An XID on one of a job's GPUs ends its first attempt at failed_at (accounting: REQUEUED);
    the second attempt runs on the same GPUs from restarted_at to the job's end."""

    failed_at: datetime
    restarted_at: datetime
    xid: int
    slot: int  # which of the job's slots threw it


@dataclass(frozen=True)
class Fleet:
    now: datetime  # the moment history ends and live simulation begins (naive UTC)
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    shares: dict[str, float]  # account -> entitled share
    lost_gpu: tuple[str, int]  # (host, GPU index) that falls off the bus
    lost_at: datetime
    xids: tuple[tuple[datetime, int], ...]  # XID events on the lost GPU before it goes
    outage: tuple[str, datetime, datetime]  # (host, from, to): exporter down

    @property
    def start(self) -> datetime:
        return self.now - HISTORY

    def slots(self) -> list[Slot]:
        return [s for n in self.nodes for s in node_slots(n)]


SLURM_ACCOUNTS = {  # account -> (share, users)
    "nlp": (30, ("alice", "arjun", "mei")),
    "vision": (25, ("bruno", "chloe", "dmitri")),
    "speech": (15, ("elena", "farid")),
    "robotics": (15, ("gus", "hana", "ivan")),
    "students": (10, ("jo", "kemal", "lina", "marco", "nadia")),
    "ops": (5, ("oscar",)),
}
K8S_TEAMS = {  # namespace -> (team, share, users)
    "inference-prod": ("platform", 20, ("svc-serving",)),
    "recsys": ("ads", 15, ("pablo", "quinn")),
    "research": ("research", 15, ("rosa", "sven")),
    "notebooks": ("datasci", 10, ("tara", "umar", "vera")),
}

# partition -> [(profile, weight)], durations (hours: lognormal median, sigma), lane sizes
SLURM_POOLS = {
    "train": ([("train", 0.78), ("stalled", 0.12), ("held", 0.05), ("failing", 0.05)], (10.0, 0.7)),
    "batch": ([("train", 0.40), ("inference", 0.25), ("stalled", 0.08), ("held", 0.12), ("failing", 0.07), ("notebook", 0.08)], (3.0, 0.8)),
    "interactive": ([("notebook", 0.35), ("dev", 0.35), ("held", 0.15), ("inference", 0.05), ("failing", 0.10)], (2.0, 0.9)),
}
NAMES = {
    "train": ("pretrain-7b", "finetune-llama", "train-vit", "asr-conformer", "sweep-lr", "rlhf-ppo"),
    "stalled": ("pretrain-7b", "train-moe", "finetune-llama"),
    "held": ("salloc", "interactive", "bash"),
    "notebook": ("jupyter", "jupyterlab"),
    "inference": ("batch-infer", "embed-corpus", "eval-harness"),
    "dev": ("dev-shell", "debug-nccl", "profile-kernels"),
    "failing": ("train-vit", "preprocess", "finetune-llama"),
}


def build_nodes() -> tuple[Node, ...]:
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    nodes = []
    for i in range(1, 17):
        part = "train" if i <= 6 else "batch" if i <= 12 else "interactive"
        nodes.append(Node("hpc", f"hpc-gpu-{i:02d}", h100, 8, partition=part))
    for i in range(1, 9):
        mig = {}
        if i == 7:
            mig = {g: ("3g.40gb", "3g.40gb") for g in range(4)}
        elif i == 8:
            mig = {g: ("1g.10gb",) * 7 for g in range(2)}
        nodes.append(Node("k8s", f"k8s-a100-{i:02d}", a100, 4, mig=mig))
    return tuple(nodes)


def node_slots(node: Node) -> list[Slot]:
    out = []
    for g in range(node.gpus):
        profiles = node.mig.get(g)
        if profiles:
            out += [Slot(node, g, k + 1, p) for k, p in enumerate(profiles)]
        else:
            out.append(Slot(node, g))
    return out


def build(now: datetime, seed: int = 7) -> Fleet:
    """The fleet and its plan from `now - 7 days` to `now + 36 h`."""
    now = now.replace(microsecond=0, second=now.second - now.second % STEP_S)
    nodes = build_nodes()
    by_host = {n.host: n for n in nodes}
    lost = ("hpc-gpu-05", 3)
    lost_at = now - timedelta(hours=3)
    planner = _Planner(now, seed, lost, lost_at)
    for lane_slots, pool in slurm_lanes(nodes):
        planner.slurm_lane(lane_slots, pool)
    for lane_slots, namespace, kind in k8s_lanes(nodes):
        planner.k8s_lane(lane_slots, namespace, kind)
    jobs = planner.finish()
    shares = {a: float(s) for a, (s, _) in SLURM_ACCOUNTS.items()}
    shares.update({team: float(s) for team, s, _ in K8S_TEAMS.values()})
    xids = ((lost_at - timedelta(minutes=40), 48), (lost_at - timedelta(minutes=1), 79))
    outage_host = by_host["k8s-a100-03"].host
    day3 = (now - timedelta(days=4)).replace(hour=9, minute=0, second=0)
    return Fleet(now, nodes, jobs, shares, lost, lost_at, xids, (outage_host, day3, day3 + timedelta(hours=2)))


def slurm_lanes(nodes: tuple[Node, ...]) -> list[tuple[tuple[Slot, ...], str]]:
    lanes = []
    hpc = [n for n in nodes if n.cluster == "hpc"]
    train = [n for n in hpc if n.partition == "train"]
    lanes.append((tuple(s for n in train[:2] for s in node_slots(n)), "train"))  # 16-GPU lane
    lanes += [(tuple(node_slots(n)), "train") for n in train[2:]]
    for i, n in enumerate(x for x in hpc if x.partition == "batch"):
        sizes = [(4, 4), (4, 2, 2), (2, 2, 2, 2)][i % 3]
        slots, g = node_slots(n), 0
        for size in sizes:
            lanes.append((tuple(slots[g:g + size]), "batch"))
            g += size
    for n in (x for x in hpc if x.partition == "interactive"):
        lanes += [((s,), "interactive") for s in node_slots(n)]
    return lanes


def k8s_lanes(nodes: tuple[Node, ...]) -> list[tuple[tuple[Slot, ...], str, str]]:
    k8s = {n.host: n for n in nodes if n.cluster == "k8s"}
    lanes: list[tuple[tuple[Slot, ...], str, str]] = []
    for h in ("k8s-a100-01", "k8s-a100-02"):
        lanes += [((s,), "inference-prod", "inference") for s in node_slots(k8s[h])]
    for h in ("k8s-a100-03", "k8s-a100-04"):
        lanes.append((tuple(node_slots(k8s[h])), "recsys", "train"))
    for h in ("k8s-a100-05", "k8s-a100-06"):
        s = node_slots(k8s[h])
        lanes += [(tuple(s[:2]), "research", "train"), (tuple(s[2:]), "research", "dev")]
    for s in node_slots(k8s["k8s-a100-07"]):
        lanes.append(((s,), "notebooks" if s.gpu_instance == 1 else "inference-prod", "notebook" if s.gpu_instance == 1 else "inference"))
    for s in node_slots(k8s["k8s-a100-08"]):
        lanes.append(((s,), "notebooks", "notebook") if s.gpu_instance else ((s,), "research", "dev"))
    return lanes


class _Planner:
    """Lays jobs out lane by lane with a seeded random generator per lane."""

    def __init__(self, now: datetime, seed: int, lost: tuple[str, int], lost_at: datetime):
        self.now, self.seed, self.lost, self.lost_at = now, seed, lost, lost_at
        self.begin = now - HISTORY - timedelta(hours=12)  # jobs already running when history starts
        self.horizon = now + AHEAD
        self.slurm: list[tuple] = []
        self.k8s: list[Job] = []

    def _rng(self, *key: object) -> random.Random:
        return random.Random("/".join(map(str, (self.seed, *key))))

    def _lost_lane(self, slots: tuple[Slot, ...]) -> bool:
        return any((s.node.host, s.gpu) == self.lost for s in slots)

    def slurm_lane(self, slots: tuple[Slot, ...], partition: str) -> None:
        rng = self._rng("slurm", slots[0].key)
        mix, (median_h, sigma) = SLURM_POOLS[partition]
        profiles, weights = zip(*mix)
        t = self.begin + timedelta(minutes=rng.uniform(0, 120))
        while t < self.horizon:
            profile = rng.choices(profiles, weights)[0]
            hours = 0.05 + rng.uniform(0, 0.3) if profile == "failing" else min(72.0, rng.lognormvariate(0, sigma) * median_h)
            if profile == "notebook":
                hours = max(hours, 3.0)  # notebooks are left open for hours
            start, end = _whole(t), _whole(t + timedelta(hours=hours))
            state = "FAILED" if profile == "failing" else rng.choices(("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED"), (0.85, 0.07, 0.04, 0.04))[0]
            if self._lost_lane(slots) and start < self.lost_at:
                if end > self.lost_at:
                    end, state = self.lost_at, "NODE_FAIL"
            elif self._lost_lane(slots):
                return  # the node is drained after its GPU fell off the bus
            wait_h = rng.expovariate(1 / {"train": 4.0, "batch": 1.5, "interactive": 0.1}[partition])
            account = rng.choices(list(SLURM_ACCOUNTS), [s for s, _ in SLURM_ACCOUNTS.values()])[0]
            user = rng.choice(SLURM_ACCOUNTS[account][1])
            name = rng.choice(NAMES[profile])
            self.slurm.append((start, slots, partition, "train" if profile == "failing" else profile, end, state,
                               _whole(start - timedelta(hours=wait_h)), account, user, name, _params(rng, profile, hours), rng.randrange(1 << 30)))
            gap_h = rng.expovariate(1 / (0.25 * median_h))
            t = end + timedelta(hours=gap_h, seconds=rng.randrange(60))

    def k8s_lane(self, slots: tuple[Slot, ...], namespace: str, kind: str) -> None:
        rng = self._rng("k8s", slots[0].key)
        team, _, users = K8S_TEAMS[namespace]
        t = self.begin + timedelta(minutes=rng.uniform(0, 60))
        median_h = {"inference": 60.0, "train": 8.0, "dev": 3.0, "notebook": 6.0}[kind]
        while t < self.horizon:
            hours = min(120.0, rng.lognormvariate(0, 0.5) * median_h)
            profile = kind
            if kind == "train" and rng.random() < 0.1:
                profile = "held"  # a pod that waits on a data loader that never comes
            start, end = _whole(t), _whole(t + timedelta(hours=hours))
            base = {"inference": "serve-llm", "train": "ctr-train" if namespace == "recsys" else "research-train",
                    "dev": "dev", "notebook": "jupyter"}[kind]
            pod = f"{base}-{rng.randrange(16 ** 5):05x}"
            state = "FAILED" if rng.random() < 0.04 else "COMPLETED"
            self.k8s.append(Job("k8s", "kubernetes", f"{namespace}/{pod}", pod, base, rng.choice(users), team, namespace,
                                profile, slots, start - timedelta(seconds=rng.randrange(5, 90)), start, end, state,
                                _params(rng, profile, hours), rng.randrange(1 << 30)))
            t = end + timedelta(minutes=rng.uniform(1, 0.2 * 60 * median_h))

    def finish(self) -> tuple[Job, ...]:
        jobs = list(self.k8s)
        trains = 0
        for i, (start, slots, partition, profile, end, state, submit, account, user, name, params, seed) in enumerate(sorted(self.slurm, key=lambda r: (r[6], r[0]))):
            job_id = str(481_000 + i)
            if profile == "train" and len(slots) > 1:  # some multi-GPU training jobs lose time one way each
                trains += 1
                if trains % PATTERN_EVERY == 0:
                    profile = PATTERNS[(trains // PATTERN_EVERY) % len(PATTERNS)]
                    params = (1800.0, 90 / 1800, params[2], 0.0) if profile == "checkpoint" else params
            jobs.append(Job("hpc", "slurm", job_id, job_id, name, user, account, partition, profile, slots,
                            submit, start, end, state, params, seed))
        return tuple(sorted(_plan_lemon(_plan_failures(jobs, self.now), self.now), key=lambda j: (j.start, j.job_key)))


# Planned hardware failures: the plain multi-GPU Slurm training jobs that start in the last
# FAILURES_SINCE of history, every FAILURE_EVERY-th of them (at most len(FAILURE_XIDS)), throw an
# XID on one GPU FAILURE_AT of the way through their run and are requeued, waiting REQUEUE_WAIT
FAILURES_SINCE = timedelta(hours=22)  # (not in the day the demo tests' job checks read)
FAILURE_EVERY = 2
FAILURE_XIDS = (79, 48, 94, 79)
FAILURE_AT = 0.35
REQUEUE_WAIT = timedelta(minutes=15)


def _plan_failures(jobs: list[Job], now: datetime) -> list[Job]:
    out, candidates = [], 0
    for j in sorted(jobs, key=lambda j: (j.start, j.job_key)):
        if _can_fail(j, now) and j.start >= now - FAILURES_SINCE:
            candidates += 1
            n = candidates // FAILURE_EVERY
            if candidates % FAILURE_EVERY == 0 and n <= len(FAILURE_XIDS):
                j = _failed(j, FAILURE_XIDS[n - 1])
        out.append(j)
    return out


# The lemon node: a batch node whose GPUs keep failing. len(LEMON_XIDS) of the plain multi-GPU
# training jobs on it, spread evenly over the week, lose their first attempt to an XID on one of
# its GPUs as above - improbably many for its GPU-hours against the rest of the fleet's (about 1 in
# 5,000 GPU-hours), so gpufleet.analytics.reliability's lemon test (default settings) names it and
# no other node (none of them has the 3 failures it asks for at least)
LEMON_NODE = "hpc-gpu-07"
LEMON_XIDS = (79, 48, 94, 63, 74, 79)
LEMON_QUIET = (timedelta(days=2), timedelta(days=1))  # (before now) the day the demo tests' job checks read


def _plan_lemon(jobs: list[Job], now: datetime) -> list[Job]:
    quiet_from, quiet_to = now - LEMON_QUIET[0], now - LEMON_QUIET[1]
    candidates = [j for j in sorted(jobs, key=lambda j: (j.start, j.job_key))
                  if _can_fail(j, now) and j.requeue is None and j.start >= now - HISTORY and {s.node.host for s in j.slots} == {LEMON_NODE}]
    outside = [j for j in candidates if j.end <= quiet_from or j.start >= quiet_to]
    if len(outside) >= len(LEMON_XIDS):  # (another seed's plan may have too few: then the quiet day too, or fewer failures)
        candidates = outside
    n = min(len(LEMON_XIDS), len(candidates))
    failing = {candidates[i * len(candidates) // n].job_key: LEMON_XIDS[i] for i in range(n)}
    return [_failed(j, failing[j.job_key]) if j.job_key in failing else j for j in jobs]


def _can_fail(j: Job, now: datetime) -> bool:
    """A plain multi-GPU Slurm training job whose failure, requeue wait and an hour of its second
    attempt fall before both its end and `now`."""
    restarted_at = _whole(j.start + (j.end - j.start) * FAILURE_AT) + REQUEUE_WAIT
    return (j.scheduler == "slurm" and j.profile == "train" and len(j.slots) > 1
            and restarted_at + timedelta(hours=1) < min(j.end, now))


def _failed(j: Job, xid: int) -> Job:
    """The job with its first attempt ended by `xid` on one of its GPUs FAILURE_AT of the way through, requeued."""
    failed_at = _whole(j.start + (j.end - j.start) * FAILURE_AT)
    return replace(j, requeue=Requeue(failed_at, failed_at + REQUEUE_WAIT, xid, j.seed % len(j.slots)))


def _whole(t: datetime) -> datetime:
    """Schedulers record whole seconds."""
    return t.replace(microsecond=0)


def _params(rng: random.Random, profile: str, hours: float) -> tuple[float, float, float, float]:
    """Shape parameters of a profile (see load.py for their meaning)."""
    if profile in ("train", "stalled", "failing"):
        period = rng.uniform(45, 150) * 60  # checkpoint period, s
        stall_at = hours * 3600 * rng.uniform(0.2, 0.6)
        return (period, rng.uniform(0.02, 0.06), stall_at, rng.uniform(0, period))
    if profile == "inference":
        return (rng.uniform(10, 30), rng.uniform(35, 60), rng.uniform(13, 17), 0.0)  # base %, swing %, peak hour
    if profile == "dev":
        period = rng.uniform(10, 60) * 60
        return (period, rng.uniform(0.2, 0.6), 0.0, rng.uniform(0, period))  # period s, busy fraction
    return (0.0, 0.0, 0.0, 0.0)
