"""ACL bindings and filters to and from their gRPC messages (``fjord.v1.AclBinding``,
``fjord.v1.AclBindingFilter``): one translation shared by the controller, the clients and the
Kafka listener. The enums travel as Kafka's wire codes; a bad code or shape is an
:class:`~fjord.security.acls.AclError` (INVALID_REQUEST) naming it."""

from __future__ import annotations

from fjord._proto import controller_pb2
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)


def binding_to_pb(binding: AclBinding) -> controller_pb2.AclBinding:
    pattern, entry = binding.pattern, binding.entry
    return controller_pb2.AclBinding(
        resource_type=pattern.resource_type.code,
        resource_name=pattern.name,
        pattern_type=pattern.pattern_type.code,
        principal=entry.principal,
        host=entry.host,
        operation=entry.operation.code,
        permission_type=entry.permission.code,
    )


def binding_from_pb(message: controller_pb2.AclBinding) -> AclBinding:
    return AclBinding(
        ResourcePattern(
            ResourceType.from_code(message.resource_type),
            message.resource_name,
            PatternType.from_code(message.pattern_type),
        ),
        AccessControlEntry(
            message.principal,
            message.host,
            AclOperation.from_code(message.operation),
            AclPermissionType.from_code(message.permission_type),
        ),
    )


def filter_to_pb(selector: AclBindingFilter) -> controller_pb2.AclBindingFilter:
    message = controller_pb2.AclBindingFilter(
        resource_type=selector.resource_type.code,
        pattern_type=selector.pattern_type.code,
        operation=selector.operation.code,
        permission_type=selector.permission.code,
    )
    if selector.name is not None:
        message.resource_name = selector.name
    if selector.principal is not None:
        message.principal = selector.principal
    if selector.host is not None:
        message.host = selector.host
    return message


def filter_from_pb(message: controller_pb2.AclBindingFilter) -> AclBindingFilter:
    """An unset enum (0, proto's default) reads as ANY, as an unset name matches any name."""
    return AclBindingFilter(
        ResourceType.from_code(message.resource_type or ResourceType.ANY.code),
        message.resource_name if message.HasField("resource_name") else None,
        PatternType.from_code(message.pattern_type or PatternType.ANY.code),
        message.principal if message.HasField("principal") else None,
        message.host if message.HasField("host") else None,
        AclOperation.from_code(message.operation or AclOperation.ANY.code),
        AclPermissionType.from_code(message.permission_type or AclPermissionType.ANY.code),
    )
