"""The kubelet pod-resources source against an in-process gRPC server on a Unix socket.

The server speaks the runtime-built v1 messages; the wire-compat tests pin the field
numbers with hand-encoded protobuf bytes, independent of our descriptor.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from gpufleet.exporter.jobmap.base import JobBinding, MappingError
from gpufleet.exporter.jobmap.kubelet import KubeletPodResourcesSource, parse_device_id
from gpufleet.exporter.jobmap.podresources_proto import LIST_METHOD, messages
from tests.realstack.process import wait_for

M = messages()
GPU0 = "GPU-8a3d5b0e-1c2f-4e6a-9b7d-0f1e2d3c4b5a"
GPU1 = "GPU-1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b"
MIG_A = "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"
MIG_B = "MIG-7b1c0e9d-3a4f-5e6d-8c7b-6a5f4e3d2c1b"


# --- helpers -------------------------------------------------------------------------------


def pod(name, namespace, *containers, **extra):
    return M.PodResources(name=name, namespace=namespace, containers=list(containers), **extra)


def container(name, *devices, **extra):
    return M.ContainerResources(name=name, devices=list(devices), **extra)


def devs(resource, *ids, numa=None):
    d = M.ContainerDevices(resource_name=resource, device_ids=list(ids))
    if numa is not None:
        d.topology.nodes.add(ID=numa)
    return d


def response(*pods):
    return M.ListPodResourcesResponse(pod_resources=list(pods))


def binding(pod_name, namespace, container_name, **gpu):
    return JobBinding(
        scheduler="kubernetes", source="kubelet",
        pod=pod_name, namespace=namespace, container=container_name, **gpu,
    )


class FakeKubelet:
    """A gRPC server on a Unix socket answering /v1.PodResourcesLister/List.

    `reply` is a ListPodResourcesResponse, or raw bytes sent as-is (garbage, hand-encoded
    wire bytes); `delay` makes the handler hang (released at stop, so no thread lingers).
    """

    def __init__(self, path, reply=None, delay=0.0):
        self.path, self.reply, self.delay = path, reply, delay
        self.calls = 0
        self.release = threading.Event()
        if isinstance(reply, bytes):
            serialize = lambda raw: raw  # noqa: E731
        else:
            serialize = M.ListPodResourcesResponse.SerializeToString
        handler = grpc.unary_unary_rpc_method_handler(
            self._list,
            request_deserializer=M.ListPodResourcesRequest.FromString,
            response_serializer=serialize,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        assert self.server.add_insecure_port("unix://" + path) != 0
        self.server.start()

    def _list(self, request, context):
        self.calls += 1
        if self.delay:
            self.release.wait(self.delay)
        return self.reply if self.reply is not None else response()

    def stop(self):
        self.release.set()
        self.server.stop(grace=None).wait()


@pytest.fixture
def sock(tmp_path):
    # Unix socket paths are limited to ~107 bytes; tmp_path plus a short name stays under it.
    return str(tmp_path / "k.sock")


@pytest.fixture
def kubelet(sock):
    """Start a FakeKubelet on `sock`; stopped at teardown."""
    started = []

    def start(reply=None, delay=0.0):
        server = FakeKubelet(sock, reply, delay)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def source(sock):
    src = KubeletPodResourcesSource(socket_path=sock, timeout=1.0)
    yield src
    src.close()


# --- mapping ---------------------------------------------------------------------------------


def test_whole_gpu_pods_two_containers_two_gpus(kubelet, source):
    kubelet(response(
        pod("train-0", "ml",
            container("trainer", devs("nvidia.com/gpu", GPU0, numa=0)),
            container("sidecar", devs("nvidia.com/gpu", GPU1, numa=1))),
    ))
    assert source.collect([], {}) == [
        binding("train-0", "ml", "trainer", gpu_uuid=GPU0),
        binding("train-0", "ml", "sidecar", gpu_uuid=GPU1),
    ]
    assert source.problems == []


def test_one_container_holding_two_gpus(kubelet, source):
    kubelet(response(
        pod("ddp", "research", container("worker", devs("nvidia.com/gpu", GPU0, GPU1))),
    ))
    assert source.collect([], {}) == [
        binding("ddp", "research", "worker", gpu_uuid=GPU0),
        binding("ddp", "research", "worker", gpu_uuid=GPU1),
    ]


def test_mig_devices(kubelet, source):
    kubelet(response(
        pod("infer-a", "serving", container("model", devs("nvidia.com/mig-1g.10gb", MIG_A))),
        pod("infer-b", "serving", container("model", devs("nvidia.com/mig-3g.40gb", MIG_B))),
    ))
    assert source.collect([], {}) == [
        binding("infer-a", "serving", "model", gpu_uuid=MIG_A),
        binding("infer-b", "serving", "model", gpu_uuid=MIG_B),
    ]


def test_mig_instance_shared_by_two_pods(kubelet, source):
    # time-slicing on a MIG instance: both pods get replicas of the same MIG device
    kubelet(response(
        pod("nb-1", "team-a", container("jupyter", devs("nvidia.com/mig-1g.10gb", MIG_A + "::3"))),
        pod("nb-2", "team-b", container("jupyter", devs("nvidia.com/mig-1g.10gb", MIG_A + "::7"))),
    ))
    assert source.collect([], {}) == [
        binding("nb-1", "team-a", "jupyter", gpu_uuid=MIG_A),
        binding("nb-2", "team-b", "jupyter", gpu_uuid=MIG_A),
    ]


def test_replica_suffixes_stripped_and_collapsed(kubelet, source):
    kubelet(response(
        # two replicas of one GPU in one container are one binding
        pod("mps-job", "batch", container("c", devs("nvidia.com/gpu", GPU0 + "::0", GPU0 + "::1"))),
        pod("gke-job", "batch", container("c", devs("nvidia.com/gpu", GPU1 + "/vgpu2"))),
    ))
    assert source.collect([], {}) == [
        binding("mps-job", "batch", "c", gpu_uuid=GPU0),
        binding("gke-job", "batch", "c", gpu_uuid=GPU1),
    ]


def test_device_name_ids_map_to_index(kubelet, source):
    kubelet(response(
        pod("p", "ns", container("c", devs("nvidia.com/gpu", "nvidia0", "nvidia3::1"))),
    ))
    assert source.collect([], {}) == [
        binding("p", "ns", "c", gpu_index=0),
        binding("p", "ns", "c", gpu_index=3),
    ]


def test_non_gpu_resources_and_pods_without_devices_ignored(kubelet, source):
    mem = M.ContainerMemory(memory_type="hugepages-1Gi", size=2 << 30)
    kubelet(response(
        pod("cpu-only", "default", container("app", cpu_ids=[2, 3, 4], memory=[mem])),
        pod("empty", "default"),
        pod("mixed", "ml",
            container("app",
                      devs("example.com/foo", "foo-1"),
                      devs("nvidia.com/gpu", GPU0),
                      devs("nvidia.com/gpu-other", "GPU-not-ours"),
                      cpu_ids=[0, 1], memory=[mem])),
        pod("pod-level", "ml", cpu_ids=[5], memory=[mem]),
    ))
    assert source.collect([], {}) == [binding("mixed", "ml", "app", gpu_uuid=GPU0)]
    assert source.problems == []


def test_empty_node(kubelet, source):
    kubelet(response())
    assert source.collect([], {}) == []


def test_extra_resource_names_are_configurable(kubelet, sock):
    kubelet(response(pod("p", "ns", container("c", devs("nvidia.com/gpu.shared", GPU0 + "::2")))))
    default = KubeletPodResourcesSource(socket_path=sock)
    shared = KubeletPodResourcesSource(socket_path=sock, resources=["nvidia.com/gpu.shared"])
    try:
        assert default.collect([], {}) == []
        assert shared.collect([], {}) == [binding("p", "ns", "c", gpu_uuid=GPU0)]
    finally:
        default.close()
        shared.close()


def test_odd_device_ids_skipped_and_reported(kubelet, source):
    server = kubelet(response(
        pod("p", "ns", container("c", devs("nvidia.com/gpu", "0", GPU0, "", "gpu-banana"))),
    ))
    assert source.collect([], {}) == [binding("p", "ns", "c", gpu_uuid=GPU0)]
    assert len(source.problems) == 3
    assert "ns/p" in source.problems[0] and "'0'" in source.problems[0]
    # problems are reset on each collect
    server.reply = response(pod("p", "ns", container("c", devs("nvidia.com/gpu", GPU0))))
    source.collect([], {})
    assert source.problems == []


@pytest.mark.parametrize(
    "device_id, fields",
    [
        (GPU0, {"gpu_uuid": GPU0}),
        (MIG_A + "::12", {"gpu_uuid": MIG_A}),
        (GPU0 + "/vgpu0", {"gpu_uuid": GPU0}),
        ("nvidia7", {"gpu_index": 7}),
        # MIG id format before driver R470: parent GPU uuid / GPU instance / compute instance
        ("MIG-" + GPU1 + "/5/0", {"gpu_uuid": GPU1, "gpu_instance_id": 5}),
        ("3", None),
        ("nvidia", None),
        ("GPU-", None),
        ("GPU-abc;rm -rf", None),
    ],
)
def test_parse_device_id(device_id, fields):
    assert parse_device_id(device_id) == fields


def test_channel_reused_across_collects(kubelet, source):
    server = kubelet(response(pod("p", "ns", container("c", devs("nvidia.com/gpu", GPU0)))))
    first = source.collect([], {})
    channel = source._channel
    assert source.collect([], {}) == first
    assert source._channel is channel
    assert server.calls == 2


def test_recovers_after_kubelet_restart(kubelet, source, sock):
    reply = response(pod("p", "ns", container("c", devs("nvidia.com/gpu", GPU0))))
    server = kubelet(reply)
    assert len(source.collect([], {})) == 1
    server.stop()
    if os.path.exists(sock):
        os.unlink(sock)
    with pytest.raises(MappingError):
        source.collect([], {})
    kubelet(reply)
    # a round may still find the socket mid-restart (UNAVAILABLE: broken pipe, on a loaded
    # machine): it says so, and a later round reads the new kubelet on a fresh channel
    errors: list[str] = []

    def reads_the_new_kubelet() -> bool:
        try:
            return len(source.collect([], {})) == 1
        except MappingError as e:
            errors.append(str(e))
            return False

    wait_for("the source to read the restarted kubelet", reads_the_new_kubelet, timeout=15, interval=0.2)
    assert all("unavailable" in e for e in errors), errors


# --- failures --------------------------------------------------------------------------------


def test_socket_missing(tmp_path):
    src = KubeletPodResourcesSource(socket_path=str(tmp_path / "nope.sock"))
    with pytest.raises(MappingError, match=r"nope\.sock not found: is this a Kubernetes node\?"):
        src.collect([], {})


def test_path_is_not_a_socket(tmp_path):
    path = tmp_path / "file.sock"
    path.write_text("")
    with pytest.raises(MappingError, match="is not a socket"):
        KubeletPodResourcesSource(socket_path=str(path)).collect([], {})


def test_nobody_listening_is_unavailable(sock):
    # a stale socket file left behind by a dead kubelet: connect() is refused
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.close()
    src = KubeletPodResourcesSource(socket_path=sock, timeout=1.0)
    try:
        with pytest.raises(MappingError, match="unavailable: is the kubelet running"):
            src.collect([], {})
    finally:
        src.close()


def test_hanging_server_times_out(kubelet, sock):
    kubelet(delay=10.0)
    src = KubeletPodResourcesSource(socket_path=sock, timeout=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(MappingError, match=r"timed out after 0\.3 s"):
            src.collect([], {})
    finally:
        src.close()
    assert time.monotonic() - start < 5  # (unanswered the call would hang; a loaded machine adds seconds to 0.3, not more)


def test_hanging_socket_times_out(sock):
    # a listener that accepts connections but never speaks HTTP/2
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.listen(8)
    src = KubeletPodResourcesSource(socket_path=sock, timeout=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(MappingError, match="timed out"):
            src.collect([], {})
    finally:
        src.close()
        s.close()
    assert time.monotonic() - start < 5  # (unanswered the call would hang; a loaded machine adds seconds to 0.3, not more)


def test_garbage_response(kubelet, source):
    kubelet(b"\xff\xff\xff")
    expected = r"garbled response .*3 bytes are not a v1 ListPodResourcesResponse"
    with pytest.raises(MappingError, match=expected):
        source.collect([], {})


def test_wrong_service_is_unimplemented(sock, source):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port("unix://" + sock)
    server.start()
    try:
        with pytest.raises(MappingError, match="does not serve v1 List"):
            source.collect([], {})
    finally:
        server.stop(None).wait()


# --- wire compatibility ------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(field: int, payload: bytes | str) -> bytes:
    """A length-delimited field (wire type 2): strings, sub-messages, packed repeats."""
    data = payload.encode() if isinstance(payload, str) else payload
    return tag(field, 2) + varint(len(data)) + data


def vi(field: int, value: int) -> bytes:
    """A varint field (wire type 0)."""
    return tag(field, 0) + varint(value)


# ListPodResourcesResponse{1: PodResources{1 name, 2 namespace, 3: ContainerResources{
#   1 name, 2: ContainerDevices{1 resource_name, 2 device_ids, 3: TopologyInfo{1: NUMANode{1 ID}}},
#   3 cpu_ids (packed), 4: ContainerMemory{1 memory_type, 2 size}}}}
WIRE_DEVICES = ld(1, "nvidia.com/gpu") + ld(2, GPU0) + ld(3, ld(1, vi(1, 1)))
WIRE_CONTAINER = (
    ld(1, "trainer") + ld(2, WIRE_DEVICES) + ld(3, varint(6) + varint(7))
    + ld(4, ld(1, "memory") + vi(2, 1 << 33))
)
WIRE_RESPONSE = ld(1, ld(1, "train-0") + ld(2, "ml") + ld(3, WIRE_CONTAINER))


def test_wire_bytes_parse_with_runtime_classes():
    parsed = M.ListPodResourcesResponse.FromString(WIRE_RESPONSE)
    (p,) = parsed.pod_resources
    assert (p.name, p.namespace) == ("train-0", "ml")
    (c,) = p.containers
    assert c.name == "trainer"
    assert list(c.cpu_ids) == [6, 7]
    assert (c.memory[0].memory_type, c.memory[0].size) == ("memory", 1 << 33)
    (d,) = c.devices
    assert d.resource_name == "nvidia.com/gpu"
    assert list(d.device_ids) == [GPU0]
    assert [n.ID for n in d.topology.nodes] == [1]
    # and our encoder produces exactly the same bytes
    assert parsed.SerializeToString(deterministic=True) == WIRE_RESPONSE


def test_wire_unknown_fields_from_newer_kubelet_are_skipped():
    future = ld(1, ld(1, "p") + ld(2, "ns") + vi(99, 5) + ld(3, WIRE_CONTAINER))
    (p,) = M.ListPodResourcesResponse.FromString(future).pod_resources
    assert p.name == "p" and p.containers[0].devices[0].device_ids[0] == GPU0


def test_wire_dynamic_resources_and_share_id():
    # ContainerResources.dynamic_resources=5: DynamicResource{2 claim_name, 3 claim_namespace,
    # 4: ClaimResource{1: CDIDevice{1 name}, 2 driver_name, 3 pool_name, 4 device_name, 5 share_id}}
    claim = ld(1, ld(1, "nvidia.com/gpu=gpu-0")) + ld(2, "gpu.nvidia.com") + ld(3, "node-a") \
        + ld(4, "gpu-0") + ld(5, "")
    wire = ld(1, "c") + ld(5, ld(2, "claim") + ld(3, "ns") + ld(4, claim))
    c = M.ContainerResources.FromString(wire)
    (dr,) = c.dynamic_resources
    assert (dr.claim_name, dr.claim_namespace) == ("claim", "ns")
    (cr,) = dr.claim_resources
    assert [d.name for d in cr.cdi_devices] == ["nvidia.com/gpu=gpu-0"]
    assert (cr.driver_name, cr.pool_name, cr.device_name) == ("gpu.nvidia.com", "node-a", "gpu-0")
    assert cr.HasField("share_id") and cr.share_id == ""  # proto3 optional keeps presence


def test_wire_bytes_through_grpc(kubelet, source):
    kubelet(WIRE_RESPONSE)
    assert source.collect([], {}) == [binding("train-0", "ml", "trainer", gpu_uuid=GPU0)]


def test_method_name():
    assert LIST_METHOD == "/v1.PodResourcesLister/List"


# --- wired into a running exporter ------------------------------------------------------------


def test_exporter_process_publishes_pod_job_info_from_the_kubelet(tmp_path, sock, kubelet):
    """The real exporter process, sim backend, kubelet socket served by the fake: the pod holding
    GPU 1 (by UUID) and the pod holding MIG instance 2 of GPU 0 appear in gpufleet_gpu_job_info."""
    import subprocess
    import sys
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.exporter.backends import sim_scenario
    from gpufleet.exporter.backends.sim import SimBackend

    scenario = tmp_path / "node.toml"
    scenario.write_text('hostname = "k8s-node"\nmodel = "a100"\ngpus = 2\n[[gpu]]\nindex = 0\nmig = ["3g.40gb", "3g.40gb"]\n')
    ids = SimBackend(sim_scenario.load(scenario))
    ids.open()
    gpu0, gpu1 = ids.devices()
    kubelet(response(
        pod("train", "ml", container("main", devs("nvidia.com/gpu", gpu1.uuid))),
        pod("infer", "serving", container("srv", devs("nvidia.com/mig-3g.40gb", gpu0.mig_instances[1].uuid))),
    ))
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[exporter]\nkubelet_socket = "{sock}"\ndevice_map_file = ""\ncgroup_mapping = false\nprocess_interval = 0.5\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(cfg), "--backend", "sim", "--sim-scenario", str(scenario), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().split(" at ")[1].strip()
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        info = sorted(
            (s.labels["gpu"], s.labels.get("GPU_I_ID"), s.labels["namespace"], s.labels["pod"], s.labels["container"])
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == "gpufleet_gpu_job_info"
        )
        assert info == [("0", "2", "serving", "infer", "srv"), ("1", None, "ml", "train", "main")]
        assert 'gpufleet_collector_success{collector="kubelet"} 1' in text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
