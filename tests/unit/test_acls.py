"""fjord.security.acls: Kafka's ACL model and StandardAuthorizer's decisions, as tables and
properties (deny wins; super users always pass; prefixed patterns match by prefix)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.security import ANONYMOUS, Principal
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    Authorizer,
    AuthorizerSettings,
    PatternType,
    Resource,
    ResourcePattern,
    ResourceType,
)

ALICE = Principal("alice")
BOB = Principal("bob")
HOST = "10.0.0.1"
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation


def acl(
    kind: ResourceType,
    name: str,
    op: AclOperation,
    permission: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = PatternType.LITERAL,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(kind, name, pattern), AccessControlEntry(principal, host, op, permission)
    )


def topic_acl(name: str, op: AclOperation, **kw: object) -> AclBinding:
    return acl(ResourceType.TOPIC, name, op, **kw)  # type: ignore[arg-type]


ORDERS = Resource.topic("orders")

# (bindings, principal, host, operation, resource, expected)
TABLE = [
    pytest.param([], ALICE, HOST, Op.READ, ORDERS, False, id="no acl: denied by default"),
    pytest.param([topic_acl("orders", Op.READ)], ALICE, HOST, Op.READ, ORDERS, True, id="allow"),
    pytest.param([topic_acl("orders", Op.READ)], BOB, HOST, Op.READ, ORDERS, False,
                 id="another principal"),
    pytest.param([topic_acl("orders", Op.READ)], ALICE, HOST, Op.WRITE, ORDERS, False,
                 id="another operation"),
    pytest.param([topic_acl("orders", Op.READ)], ALICE, HOST, Op.DESCRIBE, ORDERS, True,
                 id="read implies describe"),
    pytest.param([topic_acl("orders", Op.WRITE)], ALICE, HOST, Op.DESCRIBE, ORDERS, True,
                 id="write implies describe"),
    pytest.param([topic_acl("orders", Op.DELETE)], ALICE, HOST, Op.DESCRIBE, ORDERS, True,
                 id="delete implies describe"),
    pytest.param([topic_acl("orders", Op.ALTER)], ALICE, HOST, Op.DESCRIBE, ORDERS, True,
                 id="alter implies describe"),
    pytest.param([topic_acl("orders", Op.CREATE)], ALICE, HOST, Op.DESCRIBE, ORDERS, False,
                 id="create does not imply describe"),
    pytest.param([topic_acl("orders", Op.DESCRIBE)], ALICE, HOST, Op.READ, ORDERS, False,
                 id="describe implies nothing"),
    pytest.param([topic_acl("orders", Op.ALTER_CONFIGS)], ALICE, HOST, Op.DESCRIBE_CONFIGS,
                 ORDERS, True, id="alter configs implies describe configs"),
    pytest.param([topic_acl("orders", Op.ALL)], ALICE, HOST, Op.DELETE, ORDERS, True,
                 id="all allows everything"),
    pytest.param([topic_acl("orders", Op.ALL), topic_acl("orders", Op.WRITE, permission=DENY)],
                 ALICE, HOST, Op.WRITE, ORDERS, False, id="deny wins over allow all"),
    pytest.param([topic_acl("orders", Op.READ), topic_acl("orders", Op.ALL, permission=DENY)],
                 ALICE, HOST, Op.READ, ORDERS, False, id="deny all denies read"),
    pytest.param([topic_acl("orders", Op.ALL), topic_acl("orders", Op.READ, permission=DENY)],
                 ALICE, HOST, Op.DESCRIBE, ORDERS, True, id="deny read does not deny describe"),
    pytest.param([topic_acl("*", Op.READ)], ALICE, HOST, Op.READ, ORDERS, True,
                 id="wildcard resource"),
    pytest.param([topic_acl("orders", Op.READ, principal="User:*")], BOB, HOST, Op.READ, ORDERS,
                 True, id="wildcard principal"),
    pytest.param([topic_acl("orders", Op.READ, host="10.0.0.2")], ALICE, HOST, Op.READ, ORDERS,
                 False, id="another host"),
    pytest.param([topic_acl("orders", Op.READ, host=HOST)], ALICE, HOST, Op.READ, ORDERS, True,
                 id="the host"),
    pytest.param([topic_acl("ord", Op.READ, pattern=PatternType.PREFIXED)], ALICE, HOST,
                 Op.READ, ORDERS, True, id="prefixed match"),
    pytest.param([topic_acl("ord", Op.READ)], ALICE, HOST, Op.READ, ORDERS, False,
                 id="literal is not a prefix"),
    pytest.param([topic_acl("orders-eu", Op.READ, pattern=PatternType.PREFIXED)], ALICE, HOST,
                 Op.READ, ORDERS, False, id="longer prefix does not match"),
    pytest.param([topic_acl("o", Op.ALL, pattern=PatternType.PREFIXED),
                  topic_acl("orders", Op.WRITE, permission=DENY)],
                 ALICE, HOST, Op.WRITE, ORDERS, False, id="literal deny beats prefixed allow"),
    pytest.param([acl(ResourceType.GROUP, "orders", Op.READ)], ALICE, HOST, Op.READ, ORDERS,
                 False, id="a group acl does not cover the topic"),
    pytest.param([acl(ResourceType.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)], ALICE, HOST,
                 Op.IDEMPOTENT_WRITE, Resource.cluster(), True, id="cluster idempotent write"),
    pytest.param([topic_acl("orders", Op.READ)], ANONYMOUS, HOST, Op.READ, ORDERS, False,
                 id="anonymous is nobody in particular"),
    pytest.param([], Principal("broker-1", is_service=True), HOST, Op.CLUSTER_ACTION,
                 Resource.cluster(), True, id="the service identity is a super user"),
]


@pytest.mark.parametrize("bindings, principal, host, operation, resource, expected", TABLE)
def test_authorize_table(bindings, principal, host, operation, resource, expected):
    assert Authorizer(bindings).authorize(principal, host, operation, resource) is expected


def test_allow_everyone_if_no_acl_found_only_when_no_acl_covers_the_resource():
    settings = AuthorizerSettings(allow_everyone_if_no_acl_found=True)
    authorizer = Authorizer([topic_acl("orders", Op.READ)], settings)
    assert authorizer.authorize(BOB, HOST, Op.WRITE, Resource.topic("other"))
    # An ACL covers "orders" (for alice): bob is no longer let through by the default.
    assert not authorizer.authorize(BOB, HOST, Op.READ, ORDERS)
    prefixed = Authorizer(
        [topic_acl("ord", Op.READ, pattern=PatternType.PREFIXED)], settings
    )
    assert not prefixed.authorize(BOB, HOST, Op.READ, ORDERS)


def test_super_users_from_config():
    settings = AuthorizerSettings.from_config(
        {"super.users": "User:admin; User:ops", "allow.everyone.if.no.acl.found": "false"}
    )
    assert settings.super_users == {"User:admin", "User:ops"}
    authorizer = Authorizer([topic_acl("orders", Op.ALL, principal="User:admin",
                                       permission=DENY)], settings)
    assert authorizer.authorize(Principal("admin"), HOST, Op.DELETE, ORDERS)
    with pytest.raises(AclError, match=r"super\.users"):
        AuthorizerSettings.from_config({"super.users": "Group:x"})
    with pytest.raises(AclError, match=r"allow\.everyone"):
        AuthorizerSettings.from_config({"allow.everyone.if.no.acl.found": "yes"})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: topic_acl("orders", Op.CLUSTER_ACTION), "Topic does not take"),
        (lambda: acl(ResourceType.GROUP, "g", Op.WRITE), "Group does not take"),
        (lambda: acl(ResourceType.CLUSTER, "other", Op.ALTER), "kafka-cluster"),
        (lambda: topic_acl("", Op.READ), "must not be empty"),
        (lambda: topic_acl("orders", Op.ANY), "concrete"),
        (lambda: topic_acl("orders", Op.READ, permission=AclPermissionType.ANY), "ALLOW or DENY"),
        (lambda: topic_acl("orders", Op.READ, principal="alice"), "User:<name>"),
        (lambda: topic_acl("orders", Op.READ, host=""), "host"),
        (lambda: topic_acl("orders", Op.READ, pattern=PatternType.MATCH), "LITERAL or PREFIXED"),
        (lambda: acl(ResourceType.ANY, "x", Op.READ), "concrete"),
    ],
)
def test_invalid_bindings_are_refused_with_a_reason(make, message):
    with pytest.raises(AclError, match=message):
        make()


def test_names_parse_in_kafka_spellings_and_codes_round_trip():
    assert AclOperation.parse("DescribeConfigs") is Op.DESCRIBE_CONFIGS
    assert AclOperation.parse("idempotent-write") is Op.IDEMPOTENT_WRITE
    assert ResourceType.parse("TransactionalId") is ResourceType.TRANSACTIONAL_ID
    assert Op.DESCRIBE_CONFIGS.java_name == "DescribeConfigs"
    for enum in (ResourceType, PatternType, AclOperation, AclPermissionType):
        for member in enum:
            assert enum.from_code(member.code) is member
    with pytest.raises(AclError, match="unknown AclOperation 'Fly'"):
        AclOperation.parse("Fly")
    with pytest.raises(AclError, match="code 99"):
        AclOperation.from_code(99)


def test_binding_dict_round_trip_and_bad_fields():
    binding = topic_acl("ord", Op.READ, pattern=PatternType.PREFIXED, permission=DENY)
    assert AclBinding.from_dict(binding.to_dict()) == binding
    broken = {**binding.to_dict(), "operation": 3}
    with pytest.raises(AclError, match="'operation'"):
        AclBinding.from_dict(broken)


def test_filters_select_as_kafka_describe_and_delete_do():
    literal = topic_acl("orders", Op.READ)
    prefixed = topic_acl("ord", Op.WRITE, pattern=PatternType.PREFIXED)
    wildcard = topic_acl("*", Op.DESCRIBE, principal="User:bob")
    group = acl(ResourceType.GROUP, "orders", Op.READ)
    authorizer = Authorizer([literal, prefixed, wildcard, group])
    assert authorizer.describe() == sorted([literal, prefixed, wildcard, group])
    by_name = AclBindingFilter(ResourceType.TOPIC, "orders")
    assert authorizer.describe(by_name) == [literal]
    match = AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.MATCH)
    assert set(authorizer.describe(match)) == {literal, prefixed, wildcard}
    assert authorizer.describe(AclBindingFilter(principal="User:bob")) == [wildcard]
    assert authorizer.describe(AclBindingFilter(operation=Op.WRITE)) == [prefixed]
    assert authorizer.describe(AclBindingFilter(pattern_type=PatternType.PREFIXED)) == [prefixed]
    with pytest.raises(AclError, match="MATCH needs a resource name"):
        AclBindingFilter(pattern_type=PatternType.MATCH)


# --- properties ---------------------------------------------------------------------------------

names = st.text(alphabet="abo-", min_size=1, max_size=6)
principals = st.sampled_from(["User:alice", "User:bob", "User:*"])
operations = st.sampled_from(sorted(VALID := [
    Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS, Op.ALL,
], key=lambda o: o.code))
bindings = st.builds(
    lambda name, op, perm, who, host, pattern: topic_acl(
        name, op, permission=perm, principal=who, host=host, pattern=pattern
    ),
    names, operations, st.sampled_from([ALLOW, DENY]), principals,
    st.sampled_from(["*", HOST, "10.0.0.2"]), st.sampled_from([PatternType.LITERAL,
                                                               PatternType.PREFIXED]),
)
asked = st.sampled_from([o for o in VALID if o is not Op.ALL])


@given(st.lists(bindings, max_size=8), names, asked, st.sampled_from([ALICE, BOB]))
def test_a_matching_deny_always_wins(acls, topic, operation, principal):
    resource = Resource.topic(topic)
    deny = topic_acl(topic, operation, permission=DENY, principal=str(principal))
    assert not Authorizer([*acls, deny]).authorize(principal, HOST, operation, resource)


@given(st.lists(bindings, max_size=8), names, asked, st.booleans())
def test_a_super_user_is_always_allowed(acls, topic, operation, everyone):
    settings = AuthorizerSettings(frozenset({"User:alice"}), everyone)
    acls = [*acls, topic_acl(topic, Op.ALL, permission=DENY, principal="User:alice")]
    assert Authorizer(acls, settings).authorize(ALICE, HOST, operation, Resource.topic(topic))


@given(names, names, asked)
def test_a_prefixed_allow_covers_exactly_the_names_it_prefixes(prefix, topic, operation):
    authorizer = Authorizer([topic_acl(prefix, operation, pattern=PatternType.PREFIXED)])
    expected = topic.startswith(prefix)
    assert authorizer.authorize(ALICE, HOST, operation, Resource.topic(topic)) is expected


@given(st.lists(bindings, max_size=8), names, asked, st.sampled_from([ALICE, BOB]))
def test_adding_an_allow_never_turns_an_allow_into_a_deny(acls, topic, operation, principal):
    resource = Resource.topic(topic)
    before = Authorizer(acls).authorize(principal, HOST, operation, resource)
    extra = topic_acl(topic, operation, principal=str(principal))
    after = Authorizer([*acls, extra]).authorize(principal, HOST, operation, resource)
    assert after or not before
    # ... and the added allow does allow unless a deny matches.
    denied = any(
        b.entry.permission is DENY and b.pattern.matches(resource)
        and b.entry.matches_who(str(principal), HOST)
        and b.entry.operation in (operation, Op.ALL)
        for b in acls
    )
    assert after is not denied


def test_plans_of_create_and_delete():
    from fjord.security.acls import plan_create_acls, plan_delete_acls

    read = topic_acl("orders", Op.READ)
    write = topic_acl("orders", Op.WRITE)
    group = acl(ResourceType.GROUP, "billing", Op.READ)
    table = plan_create_acls({}, [read, write, group, read])
    assert table == {read.pattern: tuple(sorted([read.entry, write.entry])),
                     group.pattern: (group.entry,)}
    assert plan_create_acls(table, [read]) == {}  # existing: nothing changes, no error
    changed, deleted = plan_delete_acls(
        table, [AclBindingFilter(operation=Op.WRITE), AclBindingFilter(ResourceType.GROUP)]
    )
    assert deleted == [[write], [group]]
    assert changed == {read.pattern: (read.entry,), group.pattern: ()}
    assert plan_delete_acls(table, [AclBindingFilter(principal="User:zed")]) == ({}, [[]])


@given(st.lists(bindings, max_size=10), st.lists(bindings, max_size=4))
def test_create_then_delete_by_the_same_bindings_restores(existing, added):
    from fjord.security.acls import plan_create_acls, plan_delete_acls

    table = plan_create_acls({}, existing)
    after = {**table, **plan_create_acls(table, added)}
    assert set(Authorizer(b for p, es in after.items() for e in es
                          for b in [AclBinding(p, e)]).bindings) == set(existing) | set(added)
    exact = [AclBindingFilter(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type,
                              b.entry.principal, b.entry.host, b.entry.operation,
                              b.entry.permission) for b in added]
    changed, _ = plan_delete_acls(after, exact)
    final = {p: es for p, es in {**after, **changed}.items() if es}
    left = {AclBinding(p, e) for p, es in final.items() for e in es}
    assert left == set(existing) - set(added)


def test_authorize_some_as_kafkas_authorize_by_resource_type():
    some = Authorizer([topic_acl("orders", Op.WRITE)])
    assert some.authorize_some(ALICE, HOST, Op.WRITE, ResourceType.TOPIC)
    assert not some.authorize_some(BOB, HOST, Op.WRITE, ResourceType.TOPIC)
    assert not some.authorize_some(ALICE, HOST, Op.WRITE, ResourceType.GROUP)
    shadowed = Authorizer([topic_acl("orders", Op.WRITE),
                           topic_acl("ord", Op.ALL, permission=DENY,
                                     pattern=PatternType.PREFIXED)])
    assert not shadowed.authorize_some(ALICE, HOST, Op.WRITE, ResourceType.TOPIC)
    wildcard_deny = Authorizer([topic_acl("x", Op.WRITE, pattern=PatternType.PREFIXED),
                                topic_acl("*", Op.WRITE, permission=DENY)])
    assert not wildcard_deny.authorize_some(ALICE, HOST, Op.WRITE, ResourceType.TOPIC)
    other_deny = Authorizer([topic_acl("orders", Op.WRITE),
                             topic_acl("payments", Op.WRITE, permission=DENY)])
    assert other_deny.authorize_some(ALICE, HOST, Op.WRITE, ResourceType.TOPIC)


def test_access_control_off_allows_and_on_counts_denials_and_raises_typed_errors():
    from fjord.errors import GroupAuthorizationError, TopicAuthorizationError
    from fjord.security.acls import NO_AUTHORIZATION, AccessControl, Caller

    class Source:
        def __init__(self, bindings):
            self.acls_identity = object()
            self._bindings = bindings

        def acl_bindings(self):
            return self._bindings

    source = Source([topic_acl("orders", Op.READ)])
    alice, bob = Caller(ALICE, HOST), Caller(BOB, HOST)
    assert NO_AUTHORIZATION.allows(source, bob, Op.WRITE, ORDERS)
    denials = []
    access = AccessControl(AuthorizerSettings(), lambda op, kind: denials.append((op, kind)))
    assert access.allows(source, alice, Op.READ, ORDERS)
    with pytest.raises(TopicAuthorizationError, match="User:bob is not authorized to Read"):
        access.require(source, bob, Op.READ, ORDERS)
    with pytest.raises(GroupAuthorizationError):
        access.require(source, bob, Op.READ, Resource.group("g"))
    assert not access.allows(source, bob, Op.DESCRIBE, ORDERS, count=False)
    assert denials == [(Op.READ, ResourceType.TOPIC), (Op.READ, ResourceType.GROUP)]
    source._bindings = []  # same identity: the cached authorizer is kept
    assert access.allows(source, alice, Op.READ, ORDERS)
    source.acls_identity = object()
    assert not access.allows(source, alice, Op.READ, ORDERS)


def test_service_config_switches_authorization_on():
    assert AuthorizerSettings.from_service_config({}) is None
    on = AuthorizerSettings.from_service_config({
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    })
    assert on == AuthorizerSettings(frozenset({"User:admin"}), False)
    with pytest.raises(AclError, match="unknown authorizer"):
        AuthorizerSettings.from_service_config({"authorizer.class.name": "x.Y"})
    with pytest.raises(AclError, match="without authorizer"):
        AuthorizerSettings.from_service_config({"super.users": "User:admin"})


def reference_decision(acls, settings, principal, host, operation, resource):
    """Kafka's rule written as a plain scan over every binding (what the indexes must equal)."""
    if principal.is_service or str(principal) in settings.super_users:
        return True
    covering = [b for b in acls if b.pattern.matches(resource)]
    mine = [b for b in covering if b.entry.matches_who(str(principal), host)]
    if any(b.entry.permission is DENY and b.entry.operation in (operation, Op.ALL)
           for b in mine):
        return False
    implied = {Op.DESCRIBE: {Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
               Op.DESCRIBE_CONFIGS: {Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}}.get(
                   operation, {operation})
    if any(b.entry.permission is ALLOW and (b.entry.operation is Op.ALL
                                            or b.entry.operation in implied) for b in mine):
        return True
    return not covering and settings.allow_everyone_if_no_acl_found


wild_bindings = st.builds(
    lambda name, op, perm, who, pattern: topic_acl(
        name, op, permission=perm, principal=who, pattern=pattern
    ),
    st.sampled_from(["*", "a", "ab", "a*", "b"]), operations, st.sampled_from([ALLOW, DENY]),
    principals, st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
)


@given(st.lists(st.one_of(bindings, wild_bindings), max_size=12),
       st.sampled_from(["*", "a", "ab", "a*", "abo", "b", "ob"]),
       asked, st.sampled_from([ALICE, BOB]), st.sampled_from([HOST, "10.0.0.2"]), st.booleans())
def test_indexed_lookup_decides_as_a_scan_of_every_binding(acls, topic, operation, principal,
                                                           host, everyone):
    settings = AuthorizerSettings(frozenset(), everyone)
    resource = Resource.topic(topic)
    expected = reference_decision(acls, settings, principal, host, operation, resource)
    assert Authorizer(acls, settings).authorize(principal, host, operation, resource) is expected
