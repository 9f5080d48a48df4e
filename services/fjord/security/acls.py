"""Kafka's ACL model and its authorizer, pure (no I/O): who (principal, host) may do what
(operation) on which resource (type + name), as Kafka's ``StandardAuthorizer`` decides it.

An :class:`AclBinding` is a :class:`ResourcePattern` (type, ``LITERAL`` or ``PREFIXED``, a name;
the literal name ``*`` is the wildcard matching every resource of the type) plus an
:class:`AccessControlEntry` (principal ``User:<name>`` or ``User:*``, host or ``*``, operation,
``ALLOW``/``DENY``).

:meth:`Authorizer.authorize` answers, in this order (Kafka's order):

1. a principal in ``super.users`` (and the cluster's own service identity, which Kafka gets by
   listing the brokers' principal in ``super.users``) is allowed everything;
2. a ``DENY`` entry matching the resource, principal, host and operation (or ``ALL``) denies
   (deny wins over any allow);
3. an ``ALLOW`` entry matching them allows; operations imply others as in Kafka: ``READ``,
   ``WRITE``, ``DELETE`` and ``ALTER`` allow ``DESCRIBE``; ``ALTER_CONFIGS`` allows
   ``DESCRIBE_CONFIGS``; ``ALL`` allows every operation (and a ``DENY ALL`` denies every one);
4. when no ACL at all matches the resource (for any principal),
   ``allow.everyone.if.no.acl.found`` decides (default false);
5. otherwise deny.

The numeric codes of the enums are Kafka's wire codes (DescribeAcls etc.).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Self

from fjord.errors import (
    ClusterAuthorizationError,
    ConfigError,
    ErrorCode,
    FjordError,
    GroupAuthorizationError,
    TopicAuthorizationError,
)
from fjord.security.principal import ANONYMOUS, Principal

log = logging.getLogger(__name__)

#: The name of the one Cluster resource (Kafka's ``kafka-cluster``).
CLUSTER_RESOURCE_NAME = "kafka-cluster"
#: The literal resource name and the host matching everything.
WILDCARD = "*"
#: The principal matching every principal in an ACL entry.
WILDCARD_PRINCIPAL = "User:*"


class AclError(FjordError):
    """An ACL binding or filter that Kafka would refuse (INVALID_REQUEST), naming what."""

    code = ErrorCode.INVALID_REQUEST


class _Coded(Enum):
    """An enum whose value is Kafka's wire code, parsed from Kafka's CLI/Java names."""

    @property
    def code(self) -> int:
        return int(self.value)

    def __lt__(self, other: object) -> bool:
        # Bindings sort (describe answers are stable); within one enum, by wire code.
        if not isinstance(other, type(self)):
            return NotImplemented
        return self.code < other.code

    @classmethod
    def from_code(cls, code: int) -> Self:
        for member in cls:
            if member.value == code:
                return member
        raise AclError(f"unknown {cls.__name__} code {code}")

    @classmethod
    def parse(cls, text: str) -> Self:
        """``"Read"``, ``"READ"``, ``"DescribeConfigs"``, ``"describe_configs"``,
        ``"transactional-id"`` all name members (kafka-acls.sh spellings)."""
        wanted = text.replace("_", "").replace("-", "").lower()
        for member in cls:
            if member.name.replace("_", "").lower() == wanted:
                return member
        known = ", ".join(m.java_name for m in cls)
        raise AclError(f"unknown {cls.__name__} {text!r} (known: {known})")

    @property
    def java_name(self) -> str:
        """Kafka's display name: ``DescribeConfigs``, ``TransactionalId``."""
        return "".join(part.capitalize() for part in self.name.split("_"))


class ResourceType(_Coded):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(_Coded):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_Coded):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(_Coded):
    ANY = 1
    DENY = 2
    ALLOW = 3


#: An ALLOW of any of these operations also allows the key (Kafka's implied operations).
_IMPLIED_BY: Mapping[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
         AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}

#: The operations kafka-acls.sh accepts per resource type (ALL is accepted for every type).
VALID_OPERATIONS: Mapping[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
        AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.ALL,
    }),
    ResourceType.GROUP: frozenset({
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.ALL,
    }),
    ResourceType.CLUSTER: frozenset({
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
        AclOperation.DESCRIBE, AclOperation.ALL,
    }),
    ResourceType.TRANSACTIONAL_ID: frozenset({
        AclOperation.DESCRIBE, AclOperation.WRITE, AclOperation.ALL,
    }),
}


@dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a request acts on (what :meth:`Authorizer.authorize` is asked)."""

    resource_type: ResourceType
    name: str

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceType.GROUP, name)

    @classmethod
    def cluster(cls) -> Resource:
        return cls(ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)

    @classmethod
    def transactional_id(cls, name: str) -> Resource:
        return cls(ResourceType.TRANSACTIONAL_ID, name)

    def __str__(self) -> str:
        return f"{self.resource_type.java_name}:{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ResourcePattern:
    """Which resources an ACL covers: a LITERAL name (``*``: all of the type) or a PREFIXED one.

    Invariant (checked): a concrete type (not ANY), LITERAL or PREFIXED, a non-empty name.
    """

    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        if self.resource_type is ResourceType.ANY:
            raise AclError("an ACL's resource type must be concrete, not ANY")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(
                f"an ACL's pattern type must be LITERAL or PREFIXED, not {self.pattern_type.name}"
            )
        if not self.name:
            raise AclError("an ACL's resource name must not be empty")

    def matches(self, resource: Resource) -> bool:
        """Whether this pattern covers ``resource`` (Kafka's matching)."""
        if resource.resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return resource.name.startswith(self.name)
        return self.name == WILDCARD or self.name == resource.name

    def __str__(self) -> str:
        return (
            f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
            f"patternType={self.pattern_type.name})"
        )


@dataclass(frozen=True, slots=True, order=True)
class AccessControlEntry:
    """Who (``principal`` text, ``User:*`` for everyone; ``host`` or ``*``) is allowed or
    denied ``operation``. Invariant (checked): concrete operation and permission, a principal
    of the form ``User:<name>``, a non-empty host."""

    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def __post_init__(self) -> None:
        if self.operation is AclOperation.ANY:
            raise AclError("an ACL's operation must be concrete, not ANY")
        if self.permission is AclPermissionType.ANY:
            raise AclError("an ACL's permission type must be ALLOW or DENY, not ANY")
        if self.principal != WILDCARD_PRINCIPAL:
            try:
                Principal.parse(self.principal)
            except ConfigError as exc:
                raise AclError(str(exc)) from None
        if not self.host:
            raise AclError("an ACL's host must not be empty (use * for any host)")

    def matches_who(self, principal: str, host: str) -> bool:
        return (self.principal in (principal, WILDCARD_PRINCIPAL)) and (
            self.host in (host, WILDCARD)
        )

    def __str__(self) -> str:
        return (
            f"(principal={self.principal}, host={self.host}, operation="
            f"{self.operation.name}, permissionType={self.permission.name})"
        )


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an entry. Invariant (checked): the operation is one
    kafka-acls.sh accepts for the resource type, and a Cluster pattern is the literal
    ``kafka-cluster``."""

    pattern: ResourcePattern
    entry: AccessControlEntry

    def __post_init__(self) -> None:
        kind = self.pattern.resource_type
        if self.entry.operation not in VALID_OPERATIONS[kind]:
            allowed = ", ".join(sorted(op.java_name for op in VALID_OPERATIONS[kind]))
            raise AclError(
                f"{kind.java_name} does not take operation {self.entry.operation.java_name} "
                f"(it takes {allowed})"
            )
        if kind is ResourceType.CLUSTER and (
            self.pattern.pattern_type is not PatternType.LITERAL
            or self.pattern.name != CLUSTER_RESOURCE_NAME
        ):
            raise AclError(f"the Cluster resource is the literal name {CLUSTER_RESOURCE_NAME!r}")

    def to_dict(self) -> dict[str, str]:
        return {
            "resource_type": self.pattern.resource_type.name,
            "pattern_type": self.pattern.pattern_type.name,
            "name": self.pattern.name,
            "principal": self.entry.principal,
            "host": self.entry.host,
            "operation": self.entry.operation.name,
            "permission": self.entry.permission.name,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, object]) -> AclBinding:
        """Inverse of :meth:`to_dict`; AclError naming the field for a bad value."""
        def field(name: str) -> str:
            value = obj.get(name)
            if not isinstance(value, str):
                raise AclError(f"ACL field {name!r}: expected a string, got {value!r}")
            return value

        return cls(
            ResourcePattern(
                ResourceType.parse(field("resource_type")),
                field("name"),
                PatternType.parse(field("pattern_type")),
            ),
            AccessControlEntry(
                field("principal"),
                field("host"),
                AclOperation.parse(field("operation")),
                AclPermissionType.parse(field("permission")),
            ),
        )

    def __str__(self) -> str:
        return f"{self.pattern} {self.entry}"


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings DescribeAcls/DeleteAcls select (Kafka's ``AclBindingFilter``).

    ``None`` fields and ANY match everything. ``pattern_type`` MATCH selects every pattern that
    covers the resource named ``name`` (literal, the ``*`` wildcard and prefixes of it), as
    kafka-acls.sh ``--resource-pattern-type match``; MATCH needs a name.
    """

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def __post_init__(self) -> None:
        if self.pattern_type is PatternType.MATCH and self.name is None:
            raise AclError("pattern type MATCH needs a resource name")

    def matches(self, binding: AclBinding) -> bool:
        pattern, entry = binding.pattern, binding.entry
        if self.resource_type not in (ResourceType.ANY, pattern.resource_type):
            return False
        if self.pattern_type is PatternType.MATCH:
            assert self.name is not None
            if not pattern.matches(Resource(pattern.resource_type, self.name)):
                return False
        else:
            if self.pattern_type not in (PatternType.ANY, pattern.pattern_type):
                return False
            if self.name is not None and self.name != pattern.name:
                return False
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation not in (AclOperation.ANY, entry.operation):
            return False
        return self.permission in (AclPermissionType.ANY, entry.permission)


MATCH_ALL = AclBindingFilter()


#: A service's authorization settings (Kafka's server.properties names), read from its
#: ``--security-config`` file beside the ``ssl.*`` keys.
AUTHORIZER_KEYS = ("authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found")
#: ``authorizer.class.name`` values that switch authorization on: Kafka's two ACL authorizers
#: (KRaft's and ZooKeeper's), which decide alike; Fjord runs its own implementation for both.
AUTHORIZER_CLASS_NAMES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)


@dataclass(frozen=True, slots=True)
class AuthorizerSettings:
    """``super.users`` (principal texts, ``User:alice;User:bob`` in Kafka's property) and
    ``allow.everyone.if.no.acl.found`` (default false)."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    @classmethod
    def from_service_config(cls, config: Mapping[str, str]) -> AuthorizerSettings | None:
        """The authorization of a service's properties: None (off, Kafka's default) unless
        ``authorizer.class.name`` names an ACL authorizer. AclError naming the property for
        a bad value, also for ``super.users`` given while authorization is off."""
        name = config.get("authorizer.class.name", "").strip()
        if not name:
            for key in ("super.users", "allow.everyone.if.no.acl.found"):
                if config.get(key, "").strip():
                    raise AclError(f"{key}: has no effect without authorizer.class.name")
            return None
        if name not in AUTHORIZER_CLASS_NAMES:
            raise AclError(
                f"authorizer.class.name: unknown authorizer {name!r} (known: "
                f"{', '.join(AUTHORIZER_CLASS_NAMES)})"
            )
        return cls.from_config(config)

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> AuthorizerSettings:
        """From Kafka's property names; AclError naming the property for a bad value."""
        raw = config.get("super.users", "")
        users = frozenset(u.strip() for u in raw.split(";") if u.strip())
        for user in users:
            try:
                Principal.parse(user)
            except ConfigError as exc:
                raise AclError(f"super.users: {exc}") from None
        flag = config.get("allow.everyone.if.no.acl.found", "false").strip().lower()
        if flag not in ("true", "false"):
            raise AclError(f"allow.everyone.if.no.acl.found: expected true or false, got {flag!r}")
        return cls(users, flag == "true")


class Authorizer:
    """Answers ``authorize(principal, host, operation, resource)`` from a fixed set of
    bindings (a new Authorizer per ACL change; instances are immutable and cheap to query).

    Invariant: the answer depends only on the bindings, the settings and the arguments; DENY
    always wins over ALLOW; super users and the cluster service identity are always allowed.
    """

    def __init__(
        self, bindings: Iterable[AclBinding] = (), settings: AuthorizerSettings | None = None
    ) -> None:
        self.settings = settings or AuthorizerSettings()
        self.bindings: frozenset[AclBinding] = frozenset(bindings)
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        # Kafka's StandardAuthorizer looks ACLs up instead of scanning them: by (type, literal
        # name) -- the wildcard "*" is the literal name "*" -- and by (type, prefix), probed
        # with every prefix of the resource's name. A check costs O(len(name) + matches).
        self._literal: dict[tuple[ResourceType, str], list[AccessControlEntry]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AccessControlEntry]] = {}
        self._prefix_lengths: dict[ResourceType, list[int]] = {}
        for binding in sorted(self.bindings):
            pattern = binding.pattern
            self._by_type.setdefault(pattern.resource_type, []).append(binding)
            index = self._prefixed if pattern.pattern_type is PatternType.PREFIXED else (
                self._literal
            )
            index.setdefault((pattern.resource_type, pattern.name), []).append(binding.entry)
        lengths: dict[ResourceType, set[int]] = {}
        for kind, name in self._prefixed:
            lengths.setdefault(kind, set()).add(len(name))
        self._prefix_lengths = {kind: sorted(ls) for kind, ls in lengths.items()}

    def _entries_for(self, resource: Resource) -> list[AccessControlEntry]:
        """Every entry whose pattern covers ``resource`` (literal, wildcard, prefixes)."""
        kind, name = resource.resource_type, resource.name
        out = list(self._literal.get((kind, name), ()))
        if name != WILDCARD:
            out += self._literal.get((kind, WILDCARD), ())
        for length in self._prefix_lengths.get(kind, ()):
            if length > len(name):
                break
            out += self._prefixed.get((kind, name[:length]), ())
        return out

    def authorize(
        self, principal: Principal, host: str, operation: AclOperation, resource: Resource
    ) -> bool:
        if principal.is_service or str(principal) in self.settings.super_users:
            return True
        who = str(principal)
        allowed_by = _IMPLIED_BY.get(operation, frozenset({operation}))
        entries = self._entries_for(resource)
        any_for_resource = bool(entries)
        allowed = False
        for entry in entries:
            if not entry.matches_who(who, host):
                continue
            if entry.permission is AclPermissionType.DENY:
                if entry.operation in (operation, AclOperation.ALL):
                    return False
            elif entry.operation is AclOperation.ALL or entry.operation in allowed_by:
                allowed = True
        if allowed:
            return True
        return not any_for_resource and self.settings.allow_everyone_if_no_acl_found

    def authorize_some(
        self, principal: Principal, host: str, operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """Kafka's ``authorizeByResourceType``: whether ``principal`` may ``operation`` at
        least one resource of ``resource_type``: an ALLOW whose pattern no DENY of the same
        principal covers (a DENY on the literal ``*`` covers everything)."""
        if principal.is_service or str(principal) in self.settings.super_users:
            return True
        who = str(principal)
        bindings = self._by_type.get(resource_type, [])
        if not bindings:
            return self.settings.allow_everyone_if_no_acl_found
        allowed_by = _IMPLIED_BY.get(operation, frozenset({operation}))
        denies = [
            b.pattern for b in bindings
            if b.entry.permission is AclPermissionType.DENY and b.entry.matches_who(who, host)
            and b.entry.operation in (operation, AclOperation.ALL)
        ]
        for binding in bindings:
            entry = binding.entry
            if entry.permission is not AclPermissionType.ALLOW or not entry.matches_who(who, host):
                continue
            if entry.operation is not AclOperation.ALL and entry.operation not in allowed_by:
                continue
            if not any(_covers(deny, binding.pattern) for deny in denies):
                return True
        return False

    def describe(self, selector: AclBindingFilter = MATCH_ALL) -> list[AclBinding]:
        """The bindings ``selector`` matches, sorted."""
        return sorted(b for b in self.bindings if selector.matches(b))


def _covers(deny: ResourcePattern, allow: ResourcePattern) -> bool:
    """Whether a DENY on ``deny`` refuses every resource an ALLOW on ``allow`` covers."""
    if deny.pattern_type is PatternType.LITERAL:
        if deny.name == WILDCARD:
            return True
        return allow.pattern_type is PatternType.LITERAL and allow.name == deny.name
    return allow.name.startswith(deny.name)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: its principal and the address it came from (no Kafka ``/``)."""

    principal: Principal = ANONYMOUS
    host: str = ""


class AclSource(Protocol):
    """Where a process's current ACLs are (its newest :class:`~fjord.metadata.MetadataImage`)."""

    @property
    def acls_identity(self) -> object: ...

    def acl_bindings(self) -> list[AclBinding]: ...


_DENIAL_ERRORS: Mapping[ResourceType, Callable[[str], FjordError]] = {
    ResourceType.TOPIC: TopicAuthorizationError,
    ResourceType.GROUP: GroupAuthorizationError,
    ResourceType.CLUSTER: ClusterAuthorizationError,
    ResourceType.TRANSACTIONAL_ID: lambda message: FjordError(
        message, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    ),
}


def denial_error(operation: AclOperation, resource: Resource, caller: Caller) -> FjordError:
    """The typed error of a denial: TOPIC_/GROUP_/CLUSTER_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    by resource type, naming what was refused (never which ACL refused it)."""
    return _DENIAL_ERRORS[resource.resource_type](
        f"{caller.principal} is not authorized to {operation.java_name} {resource}"
    )


class AccessControl:
    """One process's authorization: off (``settings`` None: every request passes, Kafka
    without an authorizer) or an :class:`Authorizer` over the newest ACLs of an
    :class:`AclSource`, rebuilt only when the ACLs change.

    Invariant: every denial is reported to ``on_denied(operation, resource_type)`` (the
    denials metric) exactly once per refused check.
    """

    def __init__(
        self,
        settings: AuthorizerSettings | None,
        on_denied: Callable[[AclOperation, ResourceType], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_denied = on_denied
        self._cached: tuple[object, Authorizer] | None = None

    @property
    def enabled(self) -> bool:
        return self.settings is not None

    def _authorizer(self, source: AclSource) -> Authorizer:
        identity = source.acls_identity
        if self._cached is None or self._cached[0] is not identity:
            self._cached = (identity, Authorizer(source.acl_bindings(), self.settings))
        return self._cached[1]

    def allows(
        self, source: AclSource, caller: Caller, operation: AclOperation, resource: Resource,
        *, count: bool = True,
    ) -> bool:
        """Whether ``caller`` may ``operation`` ``resource``; ``count=False`` for checks whose
        refusal is not an error (Metadata hiding topics, ListGroups filtering)."""
        if self.settings is None:
            return True
        if self._authorizer(source).authorize(caller.principal, caller.host, operation, resource):
            return True
        if count:
            log.info("denied %s %s to %s from %s", operation.java_name, resource,
                     caller.principal, caller.host or "?")
            if self._on_denied is not None:
                self._on_denied(operation, resource.resource_type)
        return False

    def allows_some(
        self, source: AclSource, caller: Caller, operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """:meth:`Authorizer.authorize_some` (never counted: callers decide what a refusal
        means)."""
        if self.settings is None:
            return True
        return self._authorizer(source).authorize_some(
            caller.principal, caller.host, operation, resource_type
        )

    def allows_idempotent_producer(self, source: AclSource, caller: Caller) -> bool:
        """InitProducerId without a transactional id: IdempotentWrite on the cluster, or Write
        on at least one topic (Kafka 3, KIP-679); a refusal is counted once, as the cluster
        IdempotentWrite denial Kafka reports."""
        if self.settings is None:
            return True
        cluster = Resource.cluster()
        if self.allows(source, caller, AclOperation.IDEMPOTENT_WRITE, cluster, count=False):
            return True
        if self.allows_some(source, caller, AclOperation.WRITE, ResourceType.TOPIC):
            return True
        return self.allows(source, caller, AclOperation.IDEMPOTENT_WRITE, cluster)

    def require(
        self, source: AclSource, caller: Caller, operation: AclOperation, resource: Resource
    ) -> None:
        """Raise the typed denial error unless :meth:`allows`."""
        if not self.allows(source, caller, operation, resource):
            raise denial_error(operation, resource, caller)


#: Authorization off: what every process has unless its security config switches it on.
NO_AUTHORIZATION = AccessControl(None)


AclTable = Mapping[ResourcePattern, tuple[AccessControlEntry, ...]]


def plan_create_acls(
    current: AclTable, bindings: Iterable[AclBinding]
) -> dict[ResourcePattern, tuple[AccessControlEntry, ...]]:
    """The patterns whose entries change when ``bindings`` are added, with their new sorted
    entries. Adding a binding that exists already changes nothing (Kafka: not an error)."""
    changed: dict[ResourcePattern, set[AccessControlEntry]] = {}
    for binding in bindings:
        entries = changed.get(binding.pattern)
        if entries is None:
            entries = changed[binding.pattern] = set(current.get(binding.pattern, ()))
        entries.add(binding.entry)
    return {
        pattern: tuple(sorted(entries))
        for pattern, entries in changed.items()
        if tuple(sorted(entries)) != tuple(sorted(current.get(pattern, ())))
    }


def plan_delete_acls(
    current: AclTable, filters: Iterable[AclBindingFilter]
) -> tuple[dict[ResourcePattern, tuple[AccessControlEntry, ...]], list[list[AclBinding]]]:
    """What deleting by ``filters`` does: the patterns whose entries change (an empty tuple:
    the pattern goes) and, per filter in order, the bindings it deletes (sorted; a binding two
    filters match is reported under both, as Kafka does)."""
    remaining = {pattern: set(entries) for pattern, entries in current.items()}
    per_filter: list[list[AclBinding]] = []
    for selector in filters:
        matched = sorted(
            AclBinding(pattern, entry)
            for pattern, entries in current.items()
            for entry in entries
            if selector.matches(AclBinding(pattern, entry))
        )
        for binding in matched:
            remaining[binding.pattern].discard(binding.entry)
        per_filter.append(matched)
    changed = {
        pattern: tuple(sorted(entries))
        for pattern, entries in remaining.items()
        if len(entries) != len(current[pattern])
    }
    return changed, per_filter
