"""A shared GPU in the demo's week: another team's debugging job attached to a running 1-GPU dev
job's GPU for two hours (Slurm's `srun --overlap`, a time-sliced GPU), as the gpufleet exporter
would have shown it - both jobs mapped to the GPU, and each scrape's per-job split of its SM time
and memory (gpufleet_gpu_job_sm_utilization_ratio, _memory_used_bytes). The guest is not one of
the plan's jobs (fleet.jobs never double-books a device) and adds no load: the samples stay the
host job's; the Jobs and Teams pages and the weekly report show who shared the GPU, and how."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from gpufleet.demo.fleet import SLURM_ACCOUNTS, STEP_S, Fleet, Job

GUEST_JOB_ID = "499000"
GUEST_FOR = timedelta(hours=2)
# each scrape's split of the GPU's SM time and the memory each job held
SM_RATIO = {"host": 0.62, "guest": 0.24}
MEMORY_BYTES = {"host": 30 * 2**30, "guest": 5 * 2**30}


def host_job(fleet: Fleet) -> Job | None:
    """The 1-GPU interactive dev job, at least 3 h long and inside the history, that started
    nearest the week's middle (None: the plan has none)."""
    middle = fleet.start + (fleet.now - fleet.start) / 2
    fits = [j for j in fleet.jobs if j.cluster == "hpc" and j.partition == "interactive" and j.profile == "dev" and len(j.slots) == 1
            and j.requeue is None and j.slots[0].gpu_instance is None and j.start >= fleet.start and j.end <= fleet.now
            and j.end - j.start >= GUEST_FOR + timedelta(hours=1)]
    return min(fits, key=lambda j: (abs(j.start - middle), j.job_key), default=None)


def guest_job(fleet: Fleet) -> tuple[Job, Job] | None:
    """(host, guest): the guest on the host's GPU for GUEST_FOR in the middle of the host's run,
    on the scrape grid, of the first other account."""
    host = host_job(fleet)
    if host is None:
        return None
    s = (host.start + (host.end - host.start - GUEST_FOR) / 2).replace(microsecond=0)
    start = s - timedelta(seconds=s.second % STEP_S)
    account = next(a for a in SLURM_ACCOUNTS if a != host.account)
    return host, replace(host, job_key=GUEST_JOB_ID, job_id=GUEST_JOB_ID, name="debug-attach", user=SLURM_ACCOUNTS[account][1][0],
                         account=account, submit=start, start=start, end=start + GUEST_FOR, final_state="COMPLETED", seed=0)


def records(fleet: Fleet) -> tuple[list[Job], list[dict], list[dict]]:
    """The guest job (for the jobs table), its allocation observations and every shared scrape's
    split (Batch.shares observations); empty where the plan has no host."""
    pair = guest_job(fleet)
    if pair is None:
        return [], [], []
    host, guest = pair
    slot = guest.slots[0]
    gpu = dict(cluster=guest.cluster, host=slot.node.host, gpu_uuid=slot.gpu_uuid, gpu_instance=-1)
    last = guest.end - timedelta(seconds=STEP_S)
    allocs = [dict(gpu, scheduler=guest.scheduler, job_key=guest.job_key, gpu=slot.gpu, source="exporter", ts=t) for t in (guest.start, last)]
    shares = []
    t = guest.start
    while t < guest.end:
        shares += [dict(gpu, ts=t, scheduler=j.scheduler, job_key=j.job_key, sm_ratio=SM_RATIO[role], memory_bytes=float(MEMORY_BYTES[role]))
                   for role, j in (("host", host), ("guest", guest))]
        t += timedelta(seconds=STEP_S)
    return [guest], allocs, shares

