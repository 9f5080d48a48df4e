"""Dynamic broker configs, as Kafka's (``kafka-configs.sh --entity-type brokers --alter``),
pure: which keys may change while brokers run, under which names, and the checked result of a
change.

Two dynamic layers sit above a broker's static ``--config`` (Kafka's precedence, highest
first): the broker's own dynamic configs (``broker-configs/<id>`` in etcd, Kafka's
DYNAMIC_BROKER_CONFIG) and the cluster-wide default (``cluster-config``, Kafka's
DYNAMIC_DEFAULT_BROKER_CONFIG, also what ``fjord local up --config`` writes). Brokers watch
both and apply a change without a restart.

Names: a broker takes a topic config's default under Kafka's broker name (``log.retention.ms``
for ``retention.ms``, :data:`BROKER_SYNONYMS`); Fjord's topic name is accepted too. Configs are
stored under Fjord's key (the topic name) and described under Kafka's broker name.

Dynamic keys (:data:`DYNAMIC_BROKER_KEYS`) are those Kafka updates at run time ("cluster-wide"
in Kafka's broker config table, which also allows a per-broker value): every topic default
and the log cleaner's (and Fjord's scrubber's) rate and backoff. Every other broker or
controller key is read-only: a change is refused with Kafka's error, INVALID_REQUEST "Cannot
update these configs dynamically", and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fjord.cluster.broker_config import (
    BROKER_ONLY_KEYS,
    BROKER_SYNONYMS,
    CONTROLLER_ONLY_KEYS,
    TOPIC_CONFIG_KEYS,
    broker_key,
    validate_broker_config,
)
from fjord.cluster.topic_config import ConfigValue
from fjord.errors import ConfigError, InvalidRequestError

#: Fjord's key -> the name Kafka gives it on a broker.
BROKER_NAMES: dict[str, str] = {
    **{key: key for key in TOPIC_CONFIG_KEYS | BROKER_ONLY_KEYS | CONTROLLER_ONLY_KEYS},
    **{topic: broker for broker, topic in BROKER_SYNONYMS.items()},
}

#: The broker-only keys Kafka changes at run time (the log cleaner's throttle and backoff;
#: Fjord's scrubber's, named after them).
DYNAMIC_BROKER_ONLY_KEYS = frozenset({
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.backoff.ms",
    "log.scrubber.io.max.bytes.per.second",
    "log.scrubber.backoff.ms",
})

#: Every key a dynamic broker config may set (per broker or cluster-wide), by Fjord's name.
DYNAMIC_BROKER_KEYS = TOPIC_CONFIG_KEYS | DYNAMIC_BROKER_ONLY_KEYS

#: Dynamic keys only the controller reads, so only the cluster-wide default holds them
#: (a per-broker value would be accepted and ignored): the controller elects leaders.
CLUSTER_WIDE_ONLY_KEYS = frozenset({"unclean.leader.election.enable"})

#: Keys that never change while the cluster runs (Kafka: read-only).
READ_ONLY_BROKER_KEYS = (BROKER_ONLY_KEYS - DYNAMIC_BROKER_ONLY_KEYS) | CONTROLLER_ONLY_KEYS

assert set(BROKER_SYNONYMS.values()) <= TOPIC_CONFIG_KEYS


def broker_name(key: str) -> str:
    """The name Kafka gives Fjord's ``key`` on a broker (``retention.ms`` ->
    ``log.retention.ms``)."""
    return BROKER_NAMES.get(key, key)


def _check_keys(names: Iterable[str], default: bool) -> None:
    """INVALID_CONFIG for unknown names, then INVALID_REQUEST (Kafka's "Cannot update these
    configs dynamically") for read-only ones, each naming the keys."""
    names = list(names)
    for name in names:
        key = broker_key(name)
        if key not in DYNAMIC_BROKER_KEYS and key not in READ_ONLY_BROKER_KEYS:
            raise ConfigError(f"{name}: unknown broker config")
    read_only = sorted({n for n in names if broker_key(n) in READ_ONLY_BROKER_KEYS})
    if read_only:
        raise InvalidRequestError(
            f"Cannot update these configs dynamically: {', '.join(read_only)} (read-only: "
            "set at start with `fjord broker --config` or `fjord controller --config`)"
        )
    if not default:
        cluster_only = sorted({n for n in names if broker_key(n) in CLUSTER_WIDE_ONLY_KEYS})
        if cluster_only:
            raise InvalidRequestError(
                f"{', '.join(cluster_only)}: only a cluster-wide default can be set "
                "(--entity-default): the controller, not a broker, reads it"
            )


def plan_broker_config(
    current: Mapping[str, str],
    set_configs: Mapping[str, str],
    delete: Iterable[str],
    *,
    default: bool,
    replace_all: bool = False,
) -> dict[str, str]:
    """The dynamic configs of one entity (a broker's ``broker-configs/<id>``, or with
    ``default`` the dynamic keys of ``cluster-config``) after setting ``set_configs`` and
    deleting ``delete`` (names: Kafka's broker names or Fjord's keys). ``replace_all``
    (Kafka's non-incremental AlterConfigs): every dynamic key not set is deleted.

    Raises ConfigError (INVALID_CONFIG) naming an unknown key or a bad value, and
    InvalidRequestError naming read-only keys; the returned dict is checked by the broker's own
    rules. Keys of ``current`` that are not dynamic (the controller's, in ``cluster-config``)
    are kept as they are.
    """
    delete = list(delete)
    _check_keys([*set_configs, *delete], default)
    changes = {broker_key(k): v for k, v in set_configs.items()}
    removed = {broker_key(k) for k in delete}
    both = sorted(set(changes) & removed)
    if both:
        raise ConfigError(f"{broker_name(both[0])}: cannot be both set and deleted")
    out = {
        k: v for k, v in current.items()
        if k not in removed and not (replace_all and k in DYNAMIC_BROKER_KEYS)
    }
    out.update(changes)
    dynamic = {k: v for k, v in out.items() if k in DYNAMIC_BROKER_KEYS}
    validate_broker_config(dynamic)  # values, Fjord's refusals, each naming the key
    return out


def effective_broker_config(
    static: Mapping[str, str], cluster_config: Mapping[str, str], dynamic: Mapping[str, str]
) -> dict[str, str]:
    """A broker's broker-level config as it applies now: its static ``--config``, under the
    dynamic cluster-wide defaults, under its own dynamic configs (topic defaults included;
    the controller's keys left out)."""
    out = dict(static)
    out.update({k: v for k, v in cluster_config.items() if k in DYNAMIC_BROKER_KEYS})
    out.update({k: v for k, v in dynamic.items() if k in DYNAMIC_BROKER_KEYS})
    return out


def describe_default_broker_config(cluster_config: Mapping[str, str]) -> list[ConfigValue]:
    """The dynamic cluster-wide broker defaults (Kafka's DescribeConfigs of the BROKER
    resource with an empty name, ``kafka-configs.sh --describe --entity-default``): the
    dynamic keys of ``cluster-config`` under Kafka's broker names, sorted."""
    return sorted(
        (ConfigValue(broker_name(k), v, "CLUSTER_DEFAULT")
         for k, v in cluster_config.items() if k in DYNAMIC_BROKER_KEYS),
        key=lambda e: e.name,
    )
