"""KubernetesSource against a local HTTP server that answers like the API server.

The official client talks to 127.0.0.1 over plain HTTP; the server hands out PodList pages shaped
as the real API returns them (continue tokens, resourceVersion, Status objects on errors).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from gpufleet.collector.schema import JOB_COLUMNS
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.kubernetes import KubernetesSource, pod_gpus, pod_to_job

NOW = datetime(2024, 5, 6, 10, 0, 0)
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.collector-sa-token"
RV = "48213377"


# -- realistic API objects ---------------------------------------------------------------------

def continue_token(start: str) -> str:
    """What kube-apiserver hands out: base64 of {"v","rv","start"}."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": int(RV), "start": start + "\x00"}).encode()
    return base64.b64encode(raw).decode()


def container(name, limits=None, requests=None, image="nvcr.io/nvidia/pytorch:24.03-py3"):
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {
        "name": name, "image": image, "command": ["python", "train.py"], "resources": resources,
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
    }


def running(name, started):
    return {"name": name, "ready": True, "restartCount": 0, "started": True,
            "image": "nvcr.io/nvidia/pytorch:24.03-py3", "imageID": "nvcr.io/nvidia/pytorch@sha256:4f1c",
            "containerID": f"containerd://{name}0a1b2c", "state": {"running": {"startedAt": started}},
            "lastState": {}}


def terminated(name, started, finished, reason, code, signal=None):
    t = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": finished,
         "containerID": f"containerd://{name}9f8e7d"}
    if signal is not None:
        t["signal"] = signal
    return {"name": name, "ready": False, "restartCount": 0, "started": False,
            "image": "nvcr.io/nvidia/pytorch:24.03-py3", "imageID": "nvcr.io/nvidia/pytorch@sha256:4f1c",
            "containerID": t["containerID"], "state": {"terminated": t}, "lastState": {}}


def cond(type_, status, when, reason=None, message=None):
    c = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": when}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def pod(name, namespace, *, containers, phase, created, labels=None, owner=None, node="gpu-node-07",
        start=None, statuses=None, reason=None, message=None, conditions=None, priority_class=None,
        init_containers=None):
    meta = {"name": name, "namespace": namespace, "uid": f"6c1d9a7e-{abs(hash(name)) % 10**4:04d}-4d2b-9e0f-1a2b3c4d5e6f",
            "resourceVersion": "48213001", "creationTimestamp": created, "labels": labels or {},
            "annotations": {"kubectl.kubernetes.io/default-container": containers[0]["name"]},
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1"}]}
    if owner:
        meta["generateName"] = owner["name"] + "-"
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner.get("kind", "Job"), "name": owner["name"],
                                    "uid": "0e4f5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7", "controller": True,
                                    "blockOwnerDeletion": True}]
    spec = {"containers": containers, "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "schedulerName": "default-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"}
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    if init_containers:
        spec["initContainers"] = init_containers
    status = {"phase": phase, "qosClass": "Burstable", "conditions": conditions or []}
    if node:
        status.update(hostIP="10.20.3.17", podIP="10.244.7.31", podIPs=[{"ip": "10.244.7.31"}])
    if start:
        status["startTime"] = start
    if statuses is not None:
        status["containerStatuses"] = statuses
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {"metadata": meta, "spec": spec, "status": status}


P_RUNNING = pod(
    "train-resnet-7x9kq", "ml-research", phase="Running", created="2024-05-06T08:00:00Z", start="2024-05-06T08:00:05Z",
    labels={"team": "vision", "gpufleet.io/team": "platform", "user": "alice", "job-name": "train-resnet",
            "batch.kubernetes.io/job-name": "train-resnet"},
    owner={"name": "train-resnet"}, priority_class="research-high",
    containers=[container("trainer", limits={"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"},
                          requests={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"})],
    statuses=[running("trainer", "2024-05-06T08:01:40Z")],
    conditions=[cond("PodScheduled", "True", "2024-05-06T08:00:05Z"), cond("Ready", "True", "2024-05-06T08:01:41Z")])

P_SUCCEEDED_MIG = pod(
    "eval-llm-2b4fz", "ml-research", phase="Succeeded", created="2024-05-06T09:00:00Z", start="2024-05-06T09:00:02Z",
    labels={"gpufleet.io/team": "nlp", "user": "bob"}, owner={"name": "eval-llm"}, node="gpu-node-12",
    containers=[container("eval", limits={"nvidia.com/mig-1g.10gb": "2", "memory": "32Gi"}),
                container("log-shipper", limits={"cpu": "200m"}, image="fluent/fluent-bit:3.0")],
    statuses=[terminated("eval", "2024-05-06T09:00:30Z", "2024-05-06T09:30:00Z", "Completed", 0),
              terminated("log-shipper", "2024-05-06T09:00:31Z", "2024-05-06T09:30:02Z", "Completed", 0)],
    conditions=[cond("PodScheduled", "True", "2024-05-06T09:00:02Z"),
                cond("Ready", "False", "2024-05-06T09:30:02Z", "PodCompleted")])

P_OOM = pod(
    "finetune-oom", "ml-research", phase="Failed", created="2024-05-06T07:00:00Z", start="2024-05-06T07:00:04Z",
    containers=[container("finetune", limits={"nvidia.com/gpu": 1, "memory": "16Gi"})],
    statuses=[terminated("finetune", "2024-05-06T07:00:20Z", "2024-05-06T07:42:13Z", "OOMKilled", 137)],
    conditions=[cond("Ready", "False", "2024-05-06T07:42:14Z", "PodFailed")])

P_PENDING = pod(
    "sweep-lr-0", "batch", phase="Pending", created="2024-05-06T09:55:00Z", node=None,
    labels={"user": "carol"}, owner={"name": "sweep-lr", "kind": "StatefulSet"},
    containers=[container("sweep", limits={"nvidia.com/gpu": "8"}, requests={"nvidia.com/gpu": "8"})],
    conditions=[cond("PodScheduled", "False", "2024-05-06T09:55:00Z", "Unschedulable",
                     "0/12 nodes are available: 12 Insufficient nvidia.com/gpu.")])

P_CPU_ONLY = pod(
    "coredns-5d78c9869d-4xkzp", "kube-system", phase="Running", created="2024-05-01T00:00:00Z",
    start="2024-05-01T00:00:01Z", owner={"name": "coredns-5d78c9869d", "kind": "ReplicaSet"}, node="cpu-node-01",
    containers=[container("coredns", limits={"memory": "170Mi"}, requests={"cpu": "100m", "memory": "70Mi"},
                          image="registry.k8s.io/coredns/coredns:v1.11.1")],
    statuses=[running("coredns", "2024-05-01T00:00:03Z")])

P_NO_METADATA = {"apiVersion": "v1", "kind": "Pod",
                 "spec": {"containers": [container("x", limits={"nvidia.com/gpu": "1"})]}, "status": {"phase": "Running"}}

P_BAD_QUANTITY = pod(
    "bad-quantity", "ml-research", phase="Running", created="2024-05-06T08:00:00Z", start="2024-05-06T08:00:01Z",
    containers=[container("trainer", limits={"nvidia.com/gpu": "two"})], statuses=[running("trainer", "2024-05-06T08:00:09Z")])

P_EVICTED = pod(
    "render-farm-q8w2r", "graphics", phase="Failed", created="2024-05-06T06:00:00Z", start="2024-05-06T06:00:03Z",
    labels={"team": "vfx"}, owner={"name": "render-farm"}, node="gpu-node-03", reason="Evicted",
    message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 91340Ki.",
    containers=[container("render", limits={"nvidia.com/gpu": "1"})],
    statuses=[terminated("render", "2024-05-06T06:00:10Z", "2024-05-06T06:48:00Z", "Error", 137, signal=9)],
    conditions=[cond("DisruptionTarget", "True", "2024-05-06T06:47:58Z", "TerminationByKubelet")])

PAGES_ITEMS = [[P_RUNNING, P_SUCCEEDED_MIG, P_CPU_ONLY], [P_OOM, P_NO_METADATA, P_PENDING], [P_BAD_QUANTITY, P_EVICTED]]


def pod_list(items, token=None, remaining=None):
    meta = {"resourceVersion": RV}
    if token:
        meta["continue"] = token
        meta["remainingItemCount"] = remaining
    return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}


def paged(pages_items):
    """{continue token sent (None first) -> PodList}, chained by real-looking tokens."""
    tokens = [None] + [continue_token(f"page{i}") for i in range(1, len(pages_items))]
    out = {}
    for i, items in enumerate(pages_items):
        nxt = tokens[i + 1] if i + 1 < len(pages_items) else None
        out[tokens[i]] = pod_list(items, nxt, sum(len(p) for p in pages_items[i + 1:]))
    return out, tokens


def status_obj(code, reason, message, **meta):
    return {"kind": "Status", "apiVersion": "v1", "metadata": meta, "status": "Failure",
            "message": message, "reason": reason, "code": code}


# -- the fake API server ----------------------------------------------------------------------

class FakeApiServer:
    def __init__(self):
        self.pages: dict = {}
        self.requests: list[dict] = []
        self.errors: list[tuple[int, dict]] = []  # served (in order) before any page
        self.expire_once: set[str] = set()  # continue tokens answered once with 410 Expired
        self.delay = 0.0
        self.released = threading.Event()  # set at stop: ends a delay early
        self.pods_present: set[str] = set()  # "namespace/name" a DELETE finds (the policy's cancel)
        self.deleted: list[str] = []
        self.annotations: dict[str, dict[str, str]] = {}  # "namespace/name" -> its annotations
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                server.requests.append({"path": url.path, "query": query, "headers": {k.lower(): v for k, v in self.headers.items()}})
                if server.delay and server.released.wait(server.delay):
                    return  # (stopped: the client that waited has given up and closed; a reply would print a broken pipe)
                token = query.get("continue")
                parts = url.path.strip("/").split("/")  # one pod: api v1 namespaces NS pods NAME
                if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                    key = f"{parts[3]}/{parts[5]}"
                    if key not in server.pods_present:
                        return self.reply(404, status_obj(404, "NotFound", f'pods "{parts[5]}" not found'))
                    return self.reply(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {
                        "name": parts[5], "namespace": parts[3], "annotations": server.annotations.get(key, {})}})
                if url.path != "/api/v1/pods":
                    return self.reply(404, status_obj(404, "NotFound", "the server could not find the requested resource"))
                if server.errors:
                    return self.reply(*server.errors.pop(0))
                if token in server.expire_once:
                    server.expire_once.discard(token)
                    return self.reply(410, status_obj(410, "Expired", "The provided continue parameter is too old "
                                                      "to display a consistent list result.", **{"continue": token}))
                if token not in server.pages:
                    return self.reply(400, status_obj(400, "BadRequest", "continue key is not valid"))
                self.reply(200, server.pages[token])

            def do_DELETE(self):
                url = urlsplit(self.path)
                server.requests.append({"method": "DELETE", "path": url.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
                parts = url.path.strip("/").split("/")  # api v1 namespaces NS pods NAME
                if len(parts) != 6 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                    return self.reply(404, status_obj(404, "NotFound", "the server could not find the requested resource"))
                key = f"{parts[3]}/{parts[5]}"
                if key not in server.pods_present:
                    return self.reply(404, status_obj(404, "NotFound", f'pods "{parts[5]}" not found'))
                server.pods_present.discard(key)
                server.deleted.append(key)
                self.reply(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": parts[5], "namespace": parts[3],
                                 "deletionTimestamp": "2024-05-06T10:00:00Z"}})

            def reply(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    server = FakeApiServer()
    yield server
    server.stop()


def source(url, **kw):
    kw.setdefault("page_size", 3)
    return KubernetesSource("prod-east", host=url, token=TOKEN, **kw)


def base_row(**fields):
    row = dict.fromkeys(JOB_COLUMNS)
    row.update(cluster="prod-east", scheduler="kubernetes", node_count=1, source="kubernetes", updated_at=NOW, gpus_source="kubernetes")
    row.update(fields)
    return row


# -- tests ------------------------------------------------------------------------------------

def test_paged_list_maps_gpu_pods_to_job_rows(api):
    api.pages, tokens = paged(PAGES_ITEMS)
    (batch,) = source(api.url).run(NOW)

    # three pages, each asked with the page size; pages 2 and 3 with the previous page's token
    assert [r["path"] for r in api.requests] == ["/api/v1/pods"] * 3
    assert [r["query"].get("limit") for r in api.requests] == ["3", "3", "3"]
    assert [r["query"].get("continue") for r in api.requests] == tokens
    assert all(r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in api.requests)

    assert batch.key == "kubernetes:prod-east:2024-05-06T10:00:00"
    assert batch.samples is None and batch.allocations == [] and batch.gpus == [] and batch.watermark is None
    assert batch.rejected == 2
    assert len(batch.problems) == 2
    assert "metadata" in batch.problems[0]
    assert "ml-research/bad-quantity" in batch.problems[1] and "'two'" in batch.problems[1]

    rows = {r["job_key"]: r for r in batch.jobs}
    assert list(rows) == ["ml-research/train-resnet-7x9kq", "ml-research/eval-llm-2b4fz", "ml-research/finetune-oom",
                          "batch/sweep-lr-0", "graphics/render-farm-q8w2r"]  # API order; CPU-only pod ignored
    for r in batch.jobs:
        assert tuple(r) == JOB_COLUMNS

    assert rows["ml-research/train-resnet-7x9kq"] == base_row(
        job_key="ml-research/train-resnet-7x9kq", job_id="train-resnet-7x9kq", name="train-resnet",
        user_name="alice", account="vision", partition="ml-research", qos="research-high",
        submit=datetime(2024, 5, 6, 8, 0, 0), start=datetime(2024, 5, 6, 8, 0, 5), end=None,
        state="RUNNING", state_raw="Running", exit_code=None, gpus=4, gpu_type=None,
        nodes="gpu-node-07", alloc_tres="nvidia.com/gpu=4")
    assert rows["ml-research/eval-llm-2b4fz"] == base_row(
        job_key="ml-research/eval-llm-2b4fz", job_id="eval-llm-2b4fz", name="eval-llm",
        user_name="bob", account="nlp", partition="ml-research",
        submit=datetime(2024, 5, 6, 9, 0, 0), start=datetime(2024, 5, 6, 9, 0, 2), end=datetime(2024, 5, 6, 9, 30, 2),
        state="COMPLETED", state_raw="Succeeded", exit_code="0:0", gpus=2, gpu_type="mig-1g.10gb",
        nodes="gpu-node-12", alloc_tres="nvidia.com/mig-1g.10gb=2")
    assert rows["ml-research/finetune-oom"] == base_row(
        job_key="ml-research/finetune-oom", job_id="finetune-oom", name="finetune-oom",
        user_name=None, account="ml-research", partition="ml-research",
        submit=datetime(2024, 5, 6, 7, 0, 0), start=datetime(2024, 5, 6, 7, 0, 4), end=datetime(2024, 5, 6, 7, 42, 13),
        state="OUT_OF_MEMORY", state_raw="Failed OOMKilled", exit_code="137:0", gpus=1, gpu_type=None,
        nodes="gpu-node-07", alloc_tres="nvidia.com/gpu=1")
    assert rows["batch/sweep-lr-0"] == base_row(
        job_key="batch/sweep-lr-0", job_id="sweep-lr-0", name="sweep-lr",
        user_name="carol", account="batch", partition="batch",
        submit=datetime(2024, 5, 6, 9, 55, 0), start=None, end=None,
        state="PENDING", state_raw="Pending Unschedulable", exit_code=None, gpus=8, gpu_type=None,
        nodes=None, alloc_tres="nvidia.com/gpu=8")
    assert rows["graphics/render-farm-q8w2r"] == base_row(
        job_key="graphics/render-farm-q8w2r", job_id="render-farm-q8w2r", name="render-farm",
        user_name=None, account="vfx", partition="graphics",
        submit=datetime(2024, 5, 6, 6, 0, 0), start=datetime(2024, 5, 6, 6, 0, 3), end=datetime(2024, 5, 6, 6, 48, 0),
        state="PREEMPTED", state_raw="Failed Evicted", exit_code="137:9", gpus=1, gpu_type=None,
        nodes="gpu-node-03", alloc_tres="nvidia.com/gpu=1")


def test_team_label_keys_are_configurable(api):
    api.pages, _ = paged([[P_RUNNING, P_SUCCEEDED_MIG]])
    (batch,) = source(api.url, team_labels=["gpufleet.io/team"], user_label="owner").run(NOW)
    got = {r["job_key"]: (r["account"], r["user_name"]) for r in batch.jobs}
    assert got == {"ml-research/train-resnet-7x9kq": ("platform", None), "ml-research/eval-llm-2b4fz": ("nlp", None)}


def test_expired_continue_token_restarts_the_list(api):
    api.pages, tokens = paged(PAGES_ITEMS)
    api.expire_once = {tokens[2]}
    (batch,) = source(api.url).run(NOW)
    assert [r["query"].get("continue") for r in api.requests] == [tokens[0], tokens[1], tokens[2]] + tokens
    assert len(batch.jobs) == 5 and batch.rejected == 2  # nothing counted twice


@pytest.mark.parametrize("code,reason,message", [
    (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:gpufleet:collector" cannot list resource '
                       '"pods" in API group "" at the cluster scope'),
    (401, "Unauthorized", "Unauthorized"),
    (500, "InternalError", "Internal error occurred: etcdserver: request timed out"),
])
def test_api_refusal_is_a_source_error(api, code, reason, message):
    api.errors = [(code, status_obj(code, reason, message))]
    with pytest.raises(SourceError) as err:
        source(api.url, retries=0).run(NOW)
    text = str(err.value)
    assert f"HTTP {code}" in text and message in text and "prod-east" in text and api.url in text


def test_connection_refused_is_a_source_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SourceError, match=r"cannot reach the API server"):
        source(f"http://127.0.0.1:{port}").run(NOW)


def test_timeout_is_a_source_error(api):
    api.pages, _ = paged([[P_RUNNING]])
    api.delay = 120.0  # (far beyond the timeout, so a loaded machine's slowness cannot pass for it)
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"(?i)timed out"):
        source(api.url, timeout_s=0.3, retries=0).run(NOW)
    assert time.monotonic() - started < 60


def test_missing_client_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(SourceError, match=r"pip install 'gpufleet\[kubernetes\]'"):
        KubernetesSource("c", host="http://127.0.0.1:1").run(NOW)


def test_module_import_does_not_import_the_client():
    code = "import sys, gpufleet.collector.sources.kubernetes; sys.exit('kubernetes' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=str(__import__("pathlib").Path(__file__).parents[1])).returncode == 0


def test_gpu_count_follows_init_and_sidecar_rules():
    spec = {
        "initContainers": [container("warm-cache", limits={"nvidia.com/gpu": "2"}),  # runs alone before the app
                           dict(container("sidecar", limits={"nvidia.com/gpu": "1"}), restartPolicy="Always")],
        "containers": [container("a", limits={"nvidia.com/gpu": "1"}), container("b", requests={"nvidia.com/gpu": "1"}),
                       container("c", limits={"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "0"})],
    }
    # app phase: a + b + sidecar = 3 > the init peak of 2; a zero count is no resource at all
    assert pod_gpus(spec) == {"nvidia.com/gpu": 3, "nvidia.com/mig-3g.40gb": 1}
    assert pod_gpus({"containers": [container("x", limits={"nvidia.com/gpu": "1"})],
                     "initContainers": [container("i", limits={"nvidia.com/gpu": "4"})]}) == {"nvidia.com/gpu": 4}


def test_unknown_phase_offsets_and_mixed_mig_profiles():
    p = pod("mixed", "ml", phase="Unknown", created="2024-05-06T12:00:00+02:00", start="2024-05-06T10:00:00.123456Z",
            containers=[container("a", limits={"nvidia.com/mig-2g.20gb": "1"}),
                        container("b", limits={"nvidia.com/mig-1g.10gb": "3"})])
    row = pod_to_job(p, "c", NOW)
    assert (row["state"], row["state_raw"]) == ("UNKNOWN", "Unknown")
    assert row["submit"] == datetime(2024, 5, 6, 10, 0, 0)  # naive UTC
    assert row["start"] == datetime(2024, 5, 6, 10, 0, 0, 123456)
    assert (row["gpus"], row["gpu_type"]) == (4, "mig-1g.10gb,mig-2g.20gb")
    assert row["alloc_tres"] == "nvidia.com/mig-1g.10gb=3,nvidia.com/mig-2g.20gb=1"
    assert pod_to_job(P_CPU_ONLY, "c", NOW) is None


def test_from_options_matches_the_config_table(api):
    """[collector.kubernetes]: kubeconfig = "" means in-cluster; extra keys pass through."""
    src = KubernetesSource.from_options("prod-east", {"enabled": True, "interval": 60.0, "kubeconfig": "",
                                                      "team_labels": ["squad"]})
    assert (src.in_cluster, src.kubeconfig, src.team_labels, src.page_size) == (True, None, ("squad",), 500)
    src = KubernetesSource.from_options("prod-east", {"kubeconfig": "/etc/gpufleet/kubeconfig", "team_labels": []})
    assert (src.in_cluster, src.kubeconfig, src.team_labels) == (False, "/etc/gpufleet/kubeconfig", ())
    api.pages, _ = paged([[P_RUNNING]])
    src = KubernetesSource.from_options("prod-east", {"kubeconfig": "", "host": api.url, "token": TOKEN, "page_size": 7})
    (batch,) = src.run(NOW)
    assert [r["job_key"] for r in batch.jobs] == ["ml-research/train-resnet-7x9kq"]
    assert api.requests[0]["query"]["limit"] == "7"


def test_unreadable_kubeconfig_is_a_source_error(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(SourceError, match=r"cannot load kubeconfig"):
        KubernetesSource("c", kubeconfig=str(bad)).run(NOW)
    with pytest.raises(SourceError, match=r"cannot load kubeconfig"):
        KubernetesSource("c", kubeconfig=str(tmp_path / "missing")).run(NOW)


def test_pod_deleted_between_listings_is_closed_in_the_store(api, tmp_path):
    """A running pod that vanishes from the API (deleted, evicted and garbage-collected) must not
    stay RUNNING forever: the next complete listing closes it as of that listing."""
    from datetime import timedelta

    from gpufleet.collector.store import StoreWriter, open_reader

    w = StoreWriter(tmp_path, clock=lambda: NOW)
    api.pages, _ = paged([[P_RUNNING, P_PENDING, P_SUCCEEDED_MIG]])
    (first,) = source(api.url).run(NOW)
    assert first.jobs_complete == ("prod-east", "kubernetes", NOW)
    w.commit(first)
    later = NOW + timedelta(minutes=1)
    api.pages, _ = paged([[P_SUCCEEDED_MIG]])  # the running and the pending pod are gone
    (second,) = source(api.url).run(later)
    w.commit(second)
    w.publish()
    rows = {r[0]: r[1:] for r in open_reader(tmp_path).execute(
        'SELECT job_key, state, state_raw, "end", start FROM jobs ORDER BY job_key').fetchall()}
    running, pending = P_RUNNING["metadata"], P_PENDING["metadata"]
    assert rows[f"{running['namespace']}/{running['name']}"][:3] == ("CANCELLED", "DELETED", later)
    assert rows[f"{pending['namespace']}/{pending['name']}"] == ("CANCELLED", "DELETED", later, None)
    assert {r[0] for r in rows.values()} == {"CANCELLED", "COMPLETED"}


def test_listing_with_an_unreadable_pod_closes_nothing(api):
    api.pages, _ = paged(PAGES_ITEMS)  # holds two malformed pods
    (batch,) = source(api.url).run(NOW)
    assert batch.rejected == 2 and batch.jobs_complete is None
