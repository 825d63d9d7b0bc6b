"""Kubernetes job mapping: which pod holds which GPU, from the kubelet pod-resources API.

The kubelet serves `v1.PodResourcesLister/List` on a Unix socket; it reports, per pod and
container, the device ids the device plugin allocated. dcgm-exporter reads the same API, so
we follow its conventions for device ids (sharing suffixes, `nvidiaN` device names).

grpcio and protobuf are imported lazily: the exporter must run on Slurm-only nodes that
have neither installed.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from typing import Mapping, Sequence

from gpufleet.exporter.jobmap.base import JobBinding, MappingError
from gpufleet.exporter.model import GpuIdentity, GpuProcess

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# An entry ending in "*" is a prefix; anything else must match the resource name exactly.
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*")
# The kubelet's own limit (podresources.DefaultMaxMsgSize); gRPC's 4 MiB default is too small
# for a node with many pods.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]+")
# MIG ids before driver R470: MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>
_LEGACY_MIG = re.compile(r"MIG-(GPU-[0-9A-Za-z-]+)/(\d+)/(\d+)")
_DEVICE_NAME = re.compile(r"nvidia(\d+)")


class _Garbled:
    """Returned by the response parser instead of raising, so that gRPC does not log a
    stack trace and we can say what was wrong."""

    def __init__(self, error: Exception, size: int):
        self.error, self.size = error, size


def parse_device_id(device_id: str) -> dict | None:
    """JobBinding fields for one pod-resources device id, or None if it is not a GPU id.

    Sharing suffixes are stripped as dcgm-exporter does: `<id>::<replica>` (NVIDIA device
    plugin time-slicing/MPS) and `<id>/vgpu<N>` (GKE). `nvidiaN` (device-name id type) is
    NVML index N, the same number as dcgm-exporter's `device` label.
    """
    base = device_id.split("::", 1)[0].split("/vgpu", 1)[0].strip()
    if _UUID.fullmatch(base):
        return {"gpu_uuid": base}
    legacy = _LEGACY_MIG.fullmatch(base)
    if legacy:
        return {"gpu_uuid": legacy.group(1), "gpu_instance_id": int(legacy.group(2))}
    name = _DEVICE_NAME.fullmatch(base)
    if name:
        return {"gpu_index": int(name.group(1))}
    return None


class KubeletPodResourcesSource:
    """MappingSource reading GPU allocations from the kubelet pod-resources v1 API."""

    name = "kubelet"

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 2.0,
        resources: Sequence[str] = DEFAULT_RESOURCES,
    ):
        self.socket_path = socket_path
        self.timeout = timeout
        self.resources = tuple(resources)
        self._channel = None
        self._list = None
        self._problems: list[str] = []

    @property
    def problems(self) -> list[str]:
        return self._problems

    def wants(self, resource_name: str) -> bool:
        return any(
            resource_name.startswith(r[:-1]) if r.endswith("*") else resource_name == r
            for r in self.resources
        )

    def collect(
        self,
        gpus: Sequence[GpuIdentity],
        processes: Mapping[int, Sequence[GpuProcess]],
    ) -> list[JobBinding]:
        """One List call; GPU and MIG UUIDs are resolved to GPUs later by the poller."""
        self._problems = []
        response = self._call_list()
        bindings: dict[JobBinding, None] = {}  # ordered set: replicas of one GPU collapse
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not self.wants(devices.resource_name):
                        continue
                    for device_id in devices.device_ids:
                        fields = parse_device_id(device_id)
                        if fields is None:
                            self._problems.append(
                                f"pod {pod.namespace}/{pod.name} container {container.name}: "
                                f"unrecognized {devices.resource_name} device id {device_id!r} "
                                "(expected GPU-/MIG- UUID or nvidiaN)"
                            )
                            continue
                        binding = JobBinding(
                            scheduler="kubernetes",
                            source=self.name,
                            pod=pod.name,
                            namespace=pod.namespace,
                            container=container.name,
                            **fields,
                        )
                        bindings[binding] = None
        for problem in self._problems:
            log.debug("kubelet mapping: %s", problem)
        return list(bindings)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None

    def _call_list(self):
        self._check_socket()
        try:
            import grpc
        except ImportError as e:
            raise MappingError(
                "kubelet mapping needs grpcio and protobuf: pip install 'gpufleet[kubernetes]'"
            ) from e
        from gpufleet.exporter.jobmap import podresources_proto as proto

        msgs = proto.messages()
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._list = self._channel.unary_unary(
                proto.LIST_METHOD,
                request_serializer=msgs.ListPodResourcesRequest.SerializeToString,
                response_deserializer=_parser(msgs.ListPodResourcesResponse),
            )
        try:
            response = self._list(msgs.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            # A fresh channel next time: gRPC's reconnect backoff would otherwise keep
            # failing for a while after the kubelet restarts.
            self.close()
            raise MappingError(self._describe(e, grpc)) from e
        if isinstance(response, _Garbled):
            raise MappingError(
                f"garbled response from kubelet pod-resources socket {self.socket_path}: "
                f"{response.size} bytes are not a v1 ListPodResourcesResponse ({response.error})"
            )
        return response

    def _check_socket(self) -> None:
        path = self.socket_path
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise MappingError(
                f"kubelet pod-resources socket {path} not found: is this a Kubernetes node? "
                "set the kubelet socket path if the kubelet root-dir is not /var/lib/kubelet, "
                "and mount /var/lib/kubelet/pod-resources into the exporter container"
            ) from None
        except OSError as e:
            raise MappingError(f"kubelet pod-resources socket {path}: {e}") from e
        if not stat.S_ISSOCK(mode):
            raise MappingError(f"kubelet pod-resources socket {path} is not a socket")
        if not os.access(path, os.R_OK | os.W_OK):
            raise MappingError(
                f"no permission to use kubelet pod-resources socket {path}: "
                "the exporter needs read/write access (usually root)"
            )

    def _describe(self, error, grpc) -> str:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        where = f"kubelet pod-resources socket {self.socket_path}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{where}: List timed out after {self.timeout:g} s (kubelet hung or overloaded)"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"{where} unavailable: is the kubelet running? ({details})"
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return f"{where}: kubelet does not serve v1 List (Kubernetes older than 1.20?)"
        name = code.name if code is not None else "error"
        return f"{where}: List failed with {name}: {details}"


def _parser(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except Exception as e:  # protobuf's DecodeError, or anything a bad payload causes
            return _Garbled(e, len(data))

    return parse
