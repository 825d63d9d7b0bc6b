"""The kubelet pod-resources v1 messages, built at runtime from a hand-written descriptor.

Why runtime descriptors: the exporter must not need a protoc/grpcio-tools codegen step (no
generated *_pb2 files to keep in sync with the installed protobuf runtime), and the wire
format only depends on field numbers and types, which are copied here exactly from
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto. Messages the exporter never reads
(GetPodResources*) are left out; unknown fields are skipped by protobuf, so a newer kubelet
still parses.

The descriptor lives in a private DescriptorPool so that it cannot clash with any other
package named "v1" loaded into the default pool. Nothing is built at import time.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "v1"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = "/v1.PodResourcesLister/List"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message name -> [(field name, number, type, label, message type name or None)]
_MESSAGES: dict[str, list[tuple]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        ("devices", 1, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 2, _INT64, _MANY, None),
        ("memory", 3, _MESSAGE, _MANY, "ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [
        ("pod_resources", 1, _MESSAGE, _MANY, "PodResources"),
    ],
    "PodResources": [
        ("name", 1, _STRING, _ONE, None),
        ("namespace", 2, _STRING, _ONE, None),
        ("containers", 3, _MESSAGE, _MANY, "ContainerResources"),
        ("cpu_ids", 4, _INT64, _MANY, None),
        ("memory", 5, _MESSAGE, _MANY, "ContainerMemory"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _ONE, None),
        ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _MANY, None),
        ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STRING, _ONE, None),
        ("size", 2, _UINT64, _ONE, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _ONE, None),
        ("device_ids", 2, _STRING, _MANY, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [
        ("nodes", 1, _MESSAGE, _MANY, "NUMANode"),
    ],
    "NUMANode": [
        ("ID", 1, _INT64, _ONE, None),
    ],
    "DynamicResource": [
        # field 1 (class_name) was removed in Kubernetes 1.31
        ("claim_name", 2, _STRING, _ONE, None),
        ("claim_namespace", 3, _STRING, _ONE, None),
        ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
        ("driver_name", 2, _STRING, _ONE, None),
        ("pool_name", 3, _STRING, _ONE, None),
        ("device_name", 4, _STRING, _ONE, None),
        # 5 `share_id` is `optional string`: added below with its synthetic oneof
    ],
    "CDIDevice": [
        ("name", 1, _STRING, _ONE, None),
    ],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="gpufleet/podresources/v1/api.proto", package=PACKAGE, syntax="proto3"
    )
    for msg_name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=msg_name)
        for name, number, ftype, label, type_name in fields:
            field = msg.field.add(name=name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
        if msg_name == "ClaimResource":
            # proto3 `optional`: a synthetic oneof named "_<field>" gives it presence
            msg.oneof_decl.add(name="_share_id")
            msg.field.add(
                name="share_id", number=5, type=_STRING, label=_ONE,
                oneof_index=0, proto3_optional=True,
            )
    service = fd.service.add(name="PodResourcesLister")
    service.method.add(
        name="List",
        input_type=f".{PACKAGE}.ListPodResourcesRequest",
        output_type=f".{PACKAGE}.ListPodResourcesResponse",
    )
    service.method.add(
        name="GetAllocatableResources",
        input_type=f".{PACKAGE}.AllocatableResourcesRequest",
        output_type=f".{PACKAGE}.AllocatableResourcesResponse",
    )
    return fd


@functools.cache
def messages() -> SimpleNamespace:
    """The v1 message classes as attributes, e.g. `messages().ListPodResourcesResponse`."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    classes = {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }
    return SimpleNamespace(**classes)
