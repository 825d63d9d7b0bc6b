"""A stand-in kubelet for the demo's Kubernetes nodes: the pod-resources gRPC service
(/v1.PodResourcesLister/List) on a Unix socket, answering from the simulated fleet.

The exporter's real kubelet mapping source (exporter/jobmap/kubelet.py) talks to it exactly as
it talks to a kubelet, so pods reach the exporter's job labels the way they do on a real node.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from gpufleet.exporter.jobmap.podresources_proto import messages


class PodResourcesServer:
    def __init__(self, socket_path: str):
        self._lock = threading.Lock()
        self._pods: list[tuple[str, str, str, str, tuple[str, ...]]] = []
        m = messages()
        handler = grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=m.ListPodResourcesRequest.FromString,
            response_serializer=m.ListPodResourcesResponse.SerializeToString,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),))
        if self.server.add_insecure_port("unix://" + socket_path) == 0:
            raise OSError(f"cannot listen on unix socket {socket_path}")

    def start(self) -> None:
        self.server.start()

    def set_pods(self, pods: list[tuple[str, str, str, str, tuple[str, ...]]]) -> None:
        """(namespace, pod, container, resource name, device ids) for every pod holding devices."""
        with self._lock:
            self._pods = list(pods)

    def _list(self, request, context):
        m = messages()
        with self._lock:
            pods = list(self._pods)
        return m.ListPodResourcesResponse(pod_resources=[
            m.PodResources(name=pod, namespace=ns, containers=[
                m.ContainerResources(name=container, devices=[m.ContainerDevices(resource_name=resource, device_ids=list(ids))])
            ])
            for ns, pod, container, resource, ids in pods
        ])

    def stop(self) -> None:
        self.server.stop(grace=None).wait()
