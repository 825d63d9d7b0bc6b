"""Kubernetes source: GPU pods from the API server, as canonical job rows.

Each run lists every pod (paged) and emits one state-snapshot batch of the pods that hold NVIDIA
GPUs or MIG instances. Samples come from the exporters, not from here.

job_key is "<namespace>/<pod>", not the pod uid: the exporters' job mapping (dcgm-exporter's
pod/namespace labels, gpufleet_gpu_job_info, the kubelet pod-resources API) only carries namespace
and name, and the key must join jobs to those series. The cost: a pod re-created under the same
name (a StatefulSet replica) overwrites the row of its predecessor.

The `kubernetes` package is imported lazily so that the collector (and the exporter-only install)
work without it.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from gpufleet.collector.schema import Batch

from gpufleet.collector.sources.base import SourceError

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"  # the device plugin's "mixed" MIG strategy: nvidia.com/mig-1g.10gb
MAX_PROBLEMS = 20
MAX_LIST_RESTARTS = 2  # a paged list whose continue token expired (410) is restarted from scratch

# Pod phase -> normalised state (the vocabulary the Slurm sources use).
PHASE_STATE = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "COMPLETED",
               "Failed": "FAILED", "Unknown": "UNKNOWN"}


class Malformed(ValueError):
    """A pod object we cannot read; it is counted and skipped, its neighbours are kept."""


class KubernetesSource:
    """Lists pods through the official client; one batch per run (a state snapshot).

    Connection, in order of precedence: an explicit `host` (+ `token`, `ca_cert` or `insecure`),
    `in_cluster` (the pod's service account), else a kubeconfig (`kubeconfig` path or the default
    lookup, optional `context`). The client is rebuilt every run so that rotated service-account
    tokens and exec-plugin credentials are picked up.
    """

    name = "kubernetes"

    def __init__(self, cluster: str, *, kubeconfig: str | None = None, context: str | None = None,
                 in_cluster: bool = False, host: str | None = None, token: str | None = None,
                 ca_cert: str | None = None, insecure: bool = False,
                 team_labels: Sequence[str] = ("team", "gpufleet.io/team"), user_label: str = "user",
                 page_size: int = 500, timeout_s: float = 30.0, retries: int = 1) -> None:
        if not cluster:
            raise ValueError("kubernetes.cluster: expected a non-empty cluster name")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"kubernetes.page_size: got {page_size!r}, expected an integer >= 1")
        if not timeout_s or timeout_s <= 0:
            raise ValueError(f"kubernetes.timeout_s: got {timeout_s!r}, expected seconds > 0")
        self.cluster, self.kubeconfig, self.context, self.in_cluster = cluster, kubeconfig, context, in_cluster
        self.host, self.token, self.ca_cert, self.insecure = host, token, ca_cert, insecure
        self.team_labels, self.user_label = tuple(team_labels), user_label
        self.page_size, self.timeout_s, self.retries = page_size, timeout_s, retries

    @classmethod
    def from_options(cls, cluster: str, opts: dict[str, Any]) -> "KubernetesSource":
        """From the validated [collector.kubernetes] table, where kubeconfig = "" means in-cluster."""
        keys = ("context", "host", "token", "ca_cert", "insecure", "team_labels", "user_label", "page_size",
                "timeout_s", "retries")
        kw = {k: opts[k] for k in keys if opts.get(k) not in (None, "")}
        if "timeout" in opts and "timeout_s" not in kw:
            kw["timeout_s"] = opts["timeout"]
        return cls(cluster, kubeconfig=opts.get("kubeconfig") or None, in_cluster=not opts.get("kubeconfig"), **kw)

    def run(self, now: datetime) -> Iterable[Batch]:
        batch = Batch(key=f"kubernetes:{self.cluster}:{now.isoformat()}")
        jobs: dict[str, dict[str, Any]] = {}
        for item in self._list_pods():
            try:
                row = pod_to_job(item, self.cluster, now, self.team_labels, self.user_label)
            except Malformed as exc:
                batch.rejected += 1
                if len(batch.problems) < MAX_PROBLEMS:
                    batch.problems.append(str(exc))
                continue
            if row is not None:
                jobs[row["job_key"]] = row
                batch.attempts.extend(pod_restarts(item, row))
        batch.jobs = list(jobs.values())
        if not batch.rejected:  # a pod we could not read may still be running: then claim nothing
            batch.jobs_complete = (self.cluster, "kubernetes", now)
        return [batch]

    # -- API access -------------------------------------------------------------------------

    def _configuration(self, kclient: Any, kconfig: Any) -> Any:
        cfg = kclient.Configuration()
        if self.host:
            cfg.host = self.host.rstrip("/")
            if self.token:
                cfg.api_key = {"authorization": self.token}
                cfg.api_key_prefix = {"authorization": "Bearer"}
            cfg.ssl_ca_cert = self.ca_cert
            cfg.verify_ssl = not self.insecure
        elif self.in_cluster:
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            kconfig.load_kube_config(config_file=self.kubeconfig, context=self.context,
                                     client_configuration=cfg, persist_config=False)
        cfg.retries = self.retries
        return cfg

    def _list_pods(self) -> list[Any]:
        """All pods, page by page; raw JSON dicts, so one odd pod cannot fail a page's decoding."""
        try:
            import urllib3
            from kubernetes import client as kclient, config as kconfig
        except ImportError as exc:
            raise SourceError(f"the kubernetes source needs the client: pip install 'gpufleet[kubernetes]' ({exc})") from exc
        where = self.host or ("in-cluster" if self.in_cluster else f"kubeconfig {self.kubeconfig or '(default)'}")
        try:
            cfg = self._configuration(kclient, kconfig)
        except (kconfig.ConfigException, OSError, ValueError) as exc:
            raise SourceError(f"kubernetes cluster {self.cluster!r}: cannot load {where}: {exc}") from exc
        failed = f"kubernetes cluster {self.cluster!r}: listing pods from {cfg.host} failed"
        with kclient.ApiClient(cfg) as api_client:
            api = kclient.CoreV1Api(api_client)
            for _attempt in range(MAX_LIST_RESTARTS + 1):
                items: list[Any] = []
                token: str | None = None
                try:
                    while True:
                        page = self._get_page(api, token)
                        items.extend(page.get("items") or [])
                        token = (page.get("metadata") or {}).get("continue") or None
                        if not token:
                            return items
                except kclient.ApiException as exc:
                    if exc.status == 410 and token:  # our continue token expired mid-list: start over
                        continue
                    if not exc.status:  # the client's wrapping of TLS failures
                        raise SourceError(f"{failed}: {exc.reason}") from exc
                    raise SourceError(f"{failed}: HTTP {exc.status} {exc.reason}: {_status_message(exc.body)}") from exc
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise SourceError(f"{failed}: cannot reach the API server: {exc}") from exc
            raise SourceError(f"{failed}: the paged list expired (410 Gone) {MAX_LIST_RESTARTS + 1} times in a row; "
                              f"the pages take longer than the API server keeps its snapshot: raise page_size")

    def _get_page(self, api: Any, token: str | None) -> dict[str, Any]:
        resp = api.list_pod_for_all_namespaces(limit=self.page_size, _continue=token, _preload_content=False,
                                               _request_timeout=self.timeout_s)
        try:
            page = json.loads(resp.data)
        except ValueError as exc:
            raise SourceError(f"kubernetes cluster {self.cluster!r}: the pod list is not JSON: {exc}") from exc
        finally:
            resp.release_conn()
        if not isinstance(page, dict) or page.get("kind") not in (None, "PodList") \
                or not isinstance(page.get("items") or [], list):
            raise SourceError(f"kubernetes cluster {self.cluster!r}: expected a PodList, got {str(page)[:200]!r}")
        return page

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str] | None:
        """One pod's annotations (None: the pod is gone); SourceError when the API cannot say."""
        def read(api: Any) -> dict[str, str]:
            resp = api.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=self.timeout_s)
            pod = json.loads(resp.data)
            annotations = (pod.get("metadata") or {}).get("annotations") if isinstance(pod, dict) else None
            return {str(k): str(v) for k, v in (annotations or {}).items()}

        return self._one_pod("reading", namespace, name, read)

    def delete_pod(self, namespace: str, name: str) -> None:
        """DELETE one pod through the same connection the listing uses (the idle-GPU policy's
        cancel). A pod already gone (404) counts as deleted; anything else is a SourceError."""
        self._one_pod("deleting", namespace, name, lambda api: api.delete_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=self.timeout_s))

    def cordon_node(self, node: str) -> None:
        """Mark a node unschedulable (kubectl cordon): the policy's drain of a lemon node. A node
        already gone (404) is left; anything else is a SourceError."""
        self._one_pod("cordoning", "", node, lambda api: api.patch_node(
            node, {"spec": {"unschedulable": True}}, _request_timeout=self.timeout_s), what=f"node {node}")

    def _one_pod(self, doing: str, namespace: str, name: str, call: Any, what: str | None = None) -> Any:
        """`call(CoreV1Api)` for one pod: its result, None when the pod is gone (404), SourceError
        naming the cluster, the pod and the API server for anything else."""
        try:
            import urllib3
            from kubernetes import client as kclient, config as kconfig
        except ImportError as exc:
            raise SourceError(f"{doing} pods needs the client: pip install 'gpufleet[kubernetes]' ({exc})") from exc
        try:
            cfg = self._configuration(kclient, kconfig)
        except (kconfig.ConfigException, OSError, ValueError) as exc:
            raise SourceError(f"kubernetes cluster {self.cluster!r}: cannot load the API configuration: {exc}") from exc
        failed = f"kubernetes cluster {self.cluster!r}: {doing} {what or f'pod {namespace}/{name}'} at {cfg.host} failed"
        with kclient.ApiClient(cfg) as api_client:
            try:
                return call(kclient.CoreV1Api(api_client))
            except kclient.ApiException as exc:
                if exc.status == 404:
                    return None
                raise SourceError(f"{failed}: HTTP {exc.status} {exc.reason}: {_status_message(exc.body)}") from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise SourceError(f"{failed}: cannot reach the API server: {exc}") from exc
            except ValueError as exc:  # not JSON
                raise SourceError(f"{failed}: {exc}") from exc


def _status_message(body: str | None) -> str:
    """The API server explains refusals in a Status object; its message is what a person needs."""
    try:
        return str(json.loads(body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return (body or "").strip()[:300] or "(no body)"


# -- pod -> job row (pure) --------------------------------------------------------------------

def pod_to_job(pod: Any, cluster: str, now: datetime, team_labels: Sequence[str] = ("team", "gpufleet.io/team"),
               user_label: str = "user") -> dict[str, Any] | None:
    """One canonical job row (gpufleet.collector.schema.JOB_COLUMNS), None for a pod without GPUs."""
    if not isinstance(pod, dict):
        raise Malformed(f"pod list item is not an object: {str(pod)[:80]!r}")
    meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status") or {}
    if not isinstance(meta, dict) or not meta.get("name") or not meta.get("namespace"):
        raise Malformed(f"pod without metadata.name/namespace: {str(pod)[:80]!r}")
    ref = f"pod {meta['namespace']}/{meta['name']}"
    if not isinstance(spec, dict) or not isinstance(status, dict):
        raise Malformed(f"{ref}: spec/status is not an object")
    try:
        gpus = pod_gpus(spec)
        if not gpus:
            return None
        labels = meta.get("labels") or {}
        phase = status.get("phase")
        statuses = [s for key in ("initContainerStatuses", "containerStatuses") for s in status.get(key) or []]
        terminated = [(s.get("state") or {}).get("terminated") for s in statuses]
        terminated = [t for t in terminated if t]
        finished = phase in ("Succeeded", "Failed")
        owners = meta.get("ownerReferences") or []
        owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
        mig = sorted(k[len("nvidia.com/"):] for k in gpus if k.startswith(MIG_PREFIX))
        return {
            "cluster": cluster, "scheduler": "kubernetes",
            "job_key": f"{meta['namespace']}/{meta['name']}", "job_id": meta["name"],
            "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None,
            "name": owner["name"] if owner else meta["name"],
            "user_name": labels.get(user_label),
            "account": next((labels[k] for k in team_labels if labels.get(k)), meta["namespace"]),
            "partition": meta["namespace"],
            "qos": spec.get("priorityClassName"),  # priority + preemption: the nearest thing to a QOS
            "submit": _ts(meta.get("creationTimestamp")), "eligible": None,
            "start": _ts(status.get("startTime")),
            "end": _end(terminated, status) if finished else None,
            "state": _state(phase, status, terminated),
            "state_raw": " ".join(filter(None, [phase, _reason(phase, status, statuses)])) or None,
            "exit_code": _exit_code(terminated) if finished else None,
            "gpus": sum(gpus.values()),
            "gpu_type": ",".join(mig) or None,  # whole GPUs: the model is known from the exporters
            "node_count": 1, "nodes": spec.get("nodeName"),
            "alloc_tres": ",".join(f"{k}={v}" for k, v in sorted(gpus.items())),
            "source": "kubernetes", "updated_at": now, "gpus_source": "kubernetes",
        }
    except Malformed as exc:
        raise Malformed(f"{ref}: {exc}") from None
    except (AttributeError, TypeError, KeyError) as exc:
        raise Malformed(f"{ref}: unexpected shape ({type(exc).__name__}: {exc})") from None


def pod_restarts(pod: dict[str, Any], job: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's earlier attempts (schema.ATTEMPT_COLUMNS) its GPU containers' statuses still show:
    each restarted container's last terminated run (`lastState.terminated`: Kubernetes keeps the
    last one only, so a container restarted twice between two listings shows one of them)."""
    gpu_containers = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or [] if _container_gpus(c)}
    out = []
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        last = ((st.get("lastState") or {}).get("terminated")) if st.get("name") in gpu_containers else None
        start = _ts(last.get("startedAt")) if last else None
        if start is None:
            continue
        code, reason = last.get("exitCode"), last.get("reason")
        state = "OUT_OF_MEMORY" if reason == "OOMKilled" else "COMPLETED" if code == 0 else "FAILED"
        out.append({"cluster": job["cluster"], "scheduler": "kubernetes", "job_key": job["job_key"], "start": start,
                    "job_id": job["job_id"], "submit": job["submit"], "end": _ts(last.get("finishedAt")), "state": state,
                    "state_raw": " ".join(filter(None, ["restarted", reason])), "exit_code": f"{code or 0}:{last.get('signal') or 0}",
                    "gpus": job["gpus"], "node_count": 1, "nodes": job["nodes"], "source": "kubernetes", "updated_at": job["updated_at"]})
    return out


def pod_gpus(spec: dict[str, Any]) -> dict[str, int]:
    """GPU resources the pod holds, by resource name, as the scheduler accounts them.

    App containers (and restartable sidecar init containers) run together and add up; classic
    init containers run one at a time before them, so the pod holds the larger of the two.
    """
    app: Counter[str] = Counter()
    init_peak: Counter[str] = Counter()
    for c in spec.get("containers") or []:
        app.update(_container_gpus(c))
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            app.update(_container_gpus(c))
        else:
            for k, v in _container_gpus(c).items():
                init_peak[k] = max(init_peak[k], v)
    held = {k: max(app[k], init_peak[k]) for k in app.keys() | init_peak.keys()}
    return {k: v for k, v in held.items() if v > 0}


def _container_gpus(c: dict[str, Any]) -> dict[str, int]:
    res = c.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    out = {}
    for k in limits.keys() | requests.keys():
        if k == GPU_RESOURCE or k.startswith(MIG_PREFIX):
            out[k] = _count(limits.get(k, requests.get(k)), k, c.get("name"))  # extended: limit == request
    return out


def _count(raw: Any, resource: str, container: Any) -> int:
    from kubernetes.utils.quantity import parse_quantity

    try:
        value = parse_quantity(raw) if not isinstance(raw, bool) else None
    except (ValueError, TypeError, ArithmeticError):
        value = None
    if value is None or value < 0 or value != int(value):
        raise Malformed(f"bad quantity {raw!r} for {resource} in container {container!r}")
    return int(value)


def _ts(value: Any) -> datetime | None:
    """RFC 3339 from the API -> naive UTC."""
    if value in (None, ""):
        return None
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise Malformed(f"bad timestamp {value!r}") from None
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t


def _end(terminated: list[dict[str, Any]], status: dict[str, Any]) -> datetime | None:
    """The last container to finish; an evicted or rejected pod may have none, then its last condition change."""
    times = [t for t in (_ts(x.get("finishedAt")) for x in terminated) if t]
    if not times:
        times = [t for t in (_ts(c.get("lastTransitionTime")) for c in status.get("conditions") or []) if t]
    return max(times, default=None)


def _state(phase: str | None, status: dict[str, Any], terminated: list[dict[str, Any]]) -> str:
    if phase == "Failed":
        if status.get("reason") == "Evicted" or any(
                c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions") or []):
            return "PREEMPTED"
        if any(t.get("reason") == "OOMKilled" for t in terminated):
            return "OUT_OF_MEMORY"
    return PHASE_STATE.get(phase or "", "UNKNOWN")


def _reason(phase: str | None, status: dict[str, Any], statuses: list[dict[str, Any]]) -> str | None:
    """Why the pod is where it is: the pod's reason, else the telling container reason."""
    if status.get("reason"):
        return status["reason"]
    if phase == "Pending":  # not placed yet: Unschedulable says the cluster is full (or the request impossible)
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason"):
                return c["reason"]
    kind = {"Failed": "terminated", "Pending": "waiting"}.get(phase or "")
    for s in statuses if kind else ():
        reason = ((s.get("state") or {}).get(kind) or {}).get("reason")
        if reason and reason != "Completed":
            return reason
    return None


def _exit_code(terminated: list[dict[str, Any]]) -> str | None:
    """sacct's "code:signal" form, from the first container that failed (else the first one)."""
    if not terminated:
        return None
    t = next((x for x in terminated if x.get("exitCode")), terminated[0])
    return f"{t.get('exitCode', 0)}:{t.get('signal') or 0}"
