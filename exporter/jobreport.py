"""Tell the node's gpufleet exporter how fast a job computes, so MFU can be measured, not guessed.

MFU (model FLOPs utilization) = achieved model FLOP/s / (GPUs x dense peak FLOP/s for the dtype).
Only the job knows its model FLOP/s: GPU counters cannot tell (GPU_UTIL says a kernel ran, not
how much it computed). A training script calls `report()` every few steps; the exporter publishes
the figure as `gpufleet_job_reported_flops` and analytics/mfu.py divides it by the peak.

    from gpufleet.exporter.jobreport import report
    report(tokens_per_second=3000, parameters=7e9)      # a dense transformer: FLOP/s = 6 x N x tokens/s
    report(flops_per_second=1.9e15)                      # or the job's own model FLOP/s count

A job that saves checkpoints says so once each is written (and how long saving it took), so an
interruption's lost work is measured from its last checkpoint instead of its start, and
`gpufleet analyze --reliability` can show the interval it used beside Young/Daly's advice:

    from gpufleet.exporter.jobreport import checkpoint_saved
    checkpoint_saved(duration_seconds=95.0)              # after the checkpoint is durable

From any other language or a shell:

    python -m gpufleet.exporter.jobreport --tokens-per-second 3000 --parameters 7e9
    python -m gpufleet.exporter.jobreport --checkpoint-saved --checkpoint-seconds 95

What to report:
- The whole job's throughput, from one process (rank 0: the figure training loops log). The GPU
  count is then the job's allocation, as the scheduler records it. A process that reports only
  its own node's or rank's share must say how many GPUs that share ran on (`gpus=`).
- tokens/s with `parameters` N: model FLOP/s = 6 x N x tokens/s, the forward (2N) and backward
  (4N) matrix-multiply FLOPs per token of a dense transformer (Kaplan et al. 2020; PaLM, arXiv
  2204.02311, appendix B). Attention's own FLOPs (PaLM's 12 x L x H x Q x T per token) are NOT
  included, so for long sequences this understates MFU; pass `flops_per_second` to include them.
  Activation recomputation is not model FLOPs and must not be counted. For a mixture of experts,
  N is the parameters active per token.

Mechanics: one small JSON file per job (and `<job>.checkpoint.json`, its last checkpoint) in
$GPUFLEET_JOB_REPORT_DIR (default /run/gpufleet/job-reports), replaced atomically (temp file +
rename) so the exporter never reads half a file. The job is $SLURM_JOB_ID, else the Kubernetes pod ($POD_NAME/$POD_NAMESPACE from the
downward API, or the pod's host name and service-account namespace). Calls closer together than
`min_interval` seconds are skipped, so calling report() every step costs nothing. Failing to write
(no such directory) is logged, never raised: monitoring must not stop a training run.
Standard library only, so any job can import this file (or copy it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CHECKPOINT_KIND = "checkpoint"  # the "kind" of a checkpoint document (a throughput report has none)
CHECKPOINT_SUFFIX = ".checkpoint.json"
DEFAULT_DIR = "/run/gpufleet/job-reports"
DIR_ENV = "GPUFLEET_JOB_REPORT_DIR"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")  # Slurm 123, 123_4, 123+0; anything file-name safe
K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # DNS subdomain: namespaces and pod names

_last_write: dict[str, float] = {}  # file path -> monotonic time of its last write


def report(
    flops_per_second: float | None = None,
    tokens_per_second: float | None = None,
    parameters: float | None = None,
    *,
    job_id: str | None = None,
    gpus: int | None = None,
    directory: str | os.PathLike | None = None,
    min_interval: float = 10.0,
) -> Path | None:
    """Publish the job's achieved throughput: `flops_per_second`, or `tokens_per_second` and
    `parameters`. `job_id`: a Slurm job id or "namespace/pod" (default: from the environment).
    `gpus`: the GPUs the figure covers (default: the job's whole allocation).

    Returns the file written, or None when skipped (too soon after the last write) or when the
    directory could not be written (logged). Bad arguments raise ValueError.
    """
    doc = build_report(flops_per_second, tokens_per_second, parameters, job_id=job_id, gpus=gpus)
    path = Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR) / file_name(doc)
    now = time.monotonic()
    last = _last_write.get(str(path))
    if last is not None and now - last < min_interval:
        return None
    try:
        _write_atomically(path, json.dumps(doc, separators=(",", ":")))
    except OSError as e:
        log.warning("cannot write the job's throughput report %s: %s", path, e)
        return None
    _last_write[str(path)] = now
    return path


def checkpoint_saved(
    duration_seconds: float | None = None,
    *,
    saved_at: float | None = None,
    job_id: str | None = None,
    directory: str | os.PathLike | None = None,
) -> Path | None:
    """Say that the job just saved a checkpoint (call it once the checkpoint is durable: work after
    it survives an interruption). `duration_seconds`: how long saving it took (the job stood still
    that long), None when not measured. `saved_at`: Unix time it was saved (default: now).

    Returns the file written, or None when the directory could not be written (logged). Never
    throttled: a job checkpoints every few minutes at most. Bad arguments raise ValueError."""
    doc = build_checkpoint(duration_seconds, saved_at=saved_at, job_id=job_id)
    path = Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR) / file_name(doc)
    try:
        _write_atomically(path, json.dumps(doc, separators=(",", ":")))
    except OSError as e:
        log.warning("cannot write the job's checkpoint report %s: %s", path, e)
        return None
    return path


def build_checkpoint(duration_seconds: float | None = None, *, saved_at: float | None = None,
                     job_id: str | None = None) -> dict:
    """The checkpoint document (validated), without writing it."""
    if duration_seconds is not None:
        _check_number("duration_seconds", duration_seconds)
    if saved_at is not None:
        _check_number("saved_at", saved_at, positive=True)
    scheduler, jid, namespace, pod = job_identity(job_id)
    return {
        "version": FORMAT_VERSION, "kind": CHECKPOINT_KIND, "scheduler": scheduler, "job_id": jid, "namespace": namespace,
        "pod": pod, "saved_at": float(saved_at) if saved_at is not None else time.time(),
        "duration_seconds": _num(duration_seconds), "host": socket.gethostname(), "pid": os.getpid(),
    }


def build_report(
    flops_per_second: float | None = None,
    tokens_per_second: float | None = None,
    parameters: float | None = None,
    *,
    job_id: str | None = None,
    gpus: int | None = None,
) -> dict:
    """The report document (validated), without writing it."""
    if flops_per_second is not None:
        if tokens_per_second is not None or parameters is not None:
            raise ValueError("give flops_per_second, or tokens_per_second and parameters, not both")
        _check_number("flops_per_second", flops_per_second)
    elif tokens_per_second is None or parameters is None:
        raise ValueError("give flops_per_second, or both tokens_per_second and parameters")
    else:
        _check_number("tokens_per_second", tokens_per_second)
        _check_number("parameters", parameters, positive=True)
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus={gpus!r}: expected a whole number of GPUs >= 1")
    scheduler, jid, namespace, pod = job_identity(job_id)
    return {
        "version": FORMAT_VERSION, "scheduler": scheduler, "job_id": jid, "namespace": namespace, "pod": pod,
        "flops_per_second": _num(flops_per_second), "tokens_per_second": _num(tokens_per_second),
        "parameters": _num(parameters), "gpus": gpus,
        "time": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
    }


def job_identity(job_id: str | None = None) -> tuple[str, str, str, str]:
    """(scheduler, job_id, namespace, pod) of the calling job: given, Slurm's, or the pod's."""
    if job_id is None:
        job_id = os.environ.get("SLURM_JOB_ID") or None
        if job_id is None:
            pod = os.environ.get("POD_NAME") or (os.environ.get("HOSTNAME") if os.environ.get("KUBERNETES_SERVICE_HOST") else None)
            namespace = os.environ.get("POD_NAMESPACE") or _read(SA_NAMESPACE_FILE)
            if pod and namespace:
                job_id = f"{namespace}/{pod}"
    if not job_id:
        raise ValueError("cannot tell which job this is: no SLURM_JOB_ID or POD_NAME/POD_NAMESPACE; pass job_id")
    if "/" in job_id:
        namespace, _, pod = job_id.partition("/")
        if not (K8S_NAME_RE.match(namespace) and K8S_NAME_RE.match(pod)):
            raise ValueError(f"job_id {job_id!r}: expected a Slurm job id or namespace/pod")
        return "kubernetes", "", namespace, pod
    if not JOB_ID_RE.match(job_id):
        raise ValueError(f"job_id {job_id!r}: expected a Slurm job id such as 123, 123_4 or 123+0")
    return "slurm", job_id, "", ""


def file_name(doc: dict) -> str:
    """`<job id>.json` (Slurm) or `<namespace>_<pod>.json` (Kubernetes names have no `_`);
    `.checkpoint.json` for a checkpoint document."""
    suffix = CHECKPOINT_SUFFIX if doc.get("kind") == CHECKPOINT_KIND else ".json"
    if doc["scheduler"] == "kubernetes":
        return f"{doc['namespace']}_{doc['pod']}{suffix}"
    return f"{doc['job_id']}{suffix}"


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the exporter may run as another user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _check_number(name: str, v: object, positive: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise ValueError(f"{name}={v!r}: expected a finite number {'> 0' if positive else '>= 0'}")


def _num(v: float | None) -> float | None:
    return None if v is None else float(v)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m gpufleet.exporter.jobreport",
        description="Report a job's achieved throughput to the gpufleet exporter (for MFU), or that it saved a "
        "checkpoint (for the work an interruption loses). Give --flops-per-second, or --tokens-per-second with "
        "--parameters (FLOP/s = 6 x parameters x tokens/s, attention FLOPs excluded), or --checkpoint-saved.",
    )
    p.add_argument("--checkpoint-saved", action="store_true", help="the job has just saved a checkpoint")
    p.add_argument("--checkpoint-seconds", type=float, help="how long saving the checkpoint took (with --checkpoint-saved)")
    p.add_argument("--flops-per-second", type=float, help="achieved model FLOP/s of the whole job (or of --gpus GPUs)")
    p.add_argument("--tokens-per-second", type=float, help="training tokens per second")
    p.add_argument("--parameters", type=float, help="model parameters N (active per token for MoE), e.g. 7e9")
    p.add_argument("--gpus", type=int, help="GPUs the figure covers (default: the job's allocation)")
    p.add_argument("--job-id", help="Slurm job id or namespace/pod (default: $SLURM_JOB_ID or the pod)")
    p.add_argument("--dir", help=f"report directory (default: ${DIR_ENV} or {DEFAULT_DIR})")
    args = p.parse_args(argv)
    try:
        if args.checkpoint_saved:
            if args.flops_per_second is not None or args.tokens_per_second is not None or args.parameters is not None:
                raise ValueError("--checkpoint-saved reports a checkpoint: give the throughput in a call of its own")
            doc = build_checkpoint(args.checkpoint_seconds, job_id=args.job_id)
        elif args.checkpoint_seconds is not None:
            raise ValueError("--checkpoint-seconds needs --checkpoint-saved")
        else:
            doc = build_report(args.flops_per_second, args.tokens_per_second, args.parameters, job_id=args.job_id, gpus=args.gpus)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = Path(args.dir or os.environ.get(DIR_ENV) or DEFAULT_DIR) / file_name(doc)
    try:
        _write_atomically(path, json.dumps(doc, separators=(",", ":")))
    except OSError as e:
        print(f"error: cannot write {path}: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
