"""Pure decisions of the operator: broker scaling (out, then rebalance; in, after draining),
topic reconciliation, and partition autoscaling from ingress samples.

Nothing here does I/O or reads a clock: the handlers observe the Kubernetes and Fjord state,
call these functions, and apply what they return. Every decision is derived from the observed
state (plus the scaling phase recorded in status), so an operator restarted at any point takes
the next step, never a step twice.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from fjord.cluster.reassignment_plan import plan_reassignment
from fjord.errors import InvalidReplicationFactorError
from fjord.topic_partition import TopicPartition
from fjord_operator.settings import DEFAULT_STABILIZATION_WINDOW_S, MAX_AUTOSCALING_SAMPLES

# -- broker scaling ---------------------------------------------------------------------------


class ScalingPhase(StrEnum):
    """``status.scaling.phase`` of a FjordCluster."""

    STABLE = "Stable"
    #: StatefulSet raised; waiting until every new broker registers with the controller.
    WAITING_FOR_BROKERS = "WaitingForBrokers"
    #: Reassignments submitted (or running) that move partitions onto the new brokers.
    REBALANCING = "Rebalancing"
    #: Reassignments that move every replica off the brokers that go.
    DRAINING = "Draining"
    #: Drained; the StatefulSet is shrunk to the spec.
    SHRINKING = "Shrinking"
    #: A scale-in that would leave a topic without enough brokers: nothing changed.
    REFUSED = "Refused"


@dataclass(frozen=True, slots=True)
class ClusterObservation:
    """What the handler saw. ``statefulset_replicas``: None when the StatefulSet does not
    exist yet. ``registered``: ids of the brokers registered with the controller (None: the
    Fjord cluster did not answer). ``assignment``: every partition's replicas, internal topics
    included. ``reassigning``: partitions with a reassignment running."""

    desired: int
    statefulset_replicas: int | None
    registered: frozenset[int] | None
    assignment: Mapping[TopicPartition, Sequence[int]] = field(default_factory=dict)
    reassigning: frozenset[TopicPartition] = frozenset()
    #: The phase recorded in status by the previous reconciliation.
    previous_phase: ScalingPhase = ScalingPhase.STABLE
    #: Each registered broker's rack (``broker.rack``; None: unset): moves onto new brokers
    #: and drains keep a partition's replicas on distinct racks when every broker has one.
    racks: Mapping[int, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """What to do now. ``statefulset_replicas``: the size to build the StatefulSet with.
    ``reassign``: target replica lists to submit (empty: none). ``done``: no step is pending
    (the cluster is at its spec). ``reason``/``message``: for the status conditions."""

    phase: ScalingPhase
    statefulset_replicas: int
    reassign: Mapping[TopicPartition, list[int]]
    done: bool
    reason: str
    message: str
    refused: bool = False


def _step(
    phase: ScalingPhase,
    replicas: int,
    reason: str,
    message: str,
    *,
    reassign: Mapping[TopicPartition, list[int]] | None = None,
    done: bool = False,
    refused: bool = False,
) -> ScalingDecision:
    return ScalingDecision(phase, replicas, dict(reassign or {}), done, reason, message, refused)


def replication_factors(
    assignment: Mapping[TopicPartition, Sequence[int]],
) -> dict[str, int]:
    """The largest replica count of each topic (a topic whose partitions differ counts its
    largest: that is what a scale-in must still place)."""
    out: dict[str, int] = {}
    for (topic, _), replicas in assignment.items():
        out[topic] = max(out.get(topic, 0), len(replicas))
    return out


def decide_scaling(obs: ClusterObservation) -> ScalingDecision:
    """The next step towards ``obs.desired`` brokers (ids 0..desired-1).

    Scale out: raise the StatefulSet at once; when all brokers registered, plan moves onto them
    with :func:`plan_reassignment` and submit; done when no reassignment runs and the plan is
    empty. Scale in: refuse when a topic's replication factor exceeds the brokers that stay;
    otherwise drain the highest ordinals (:func:`plan_reassignment` with ``drain``), wait until
    no replica is on them and no reassignment runs, and only then shrink the StatefulSet.
    """
    desired = obs.desired
    current = obs.statefulset_replicas
    if current is None:
        return _step(
            ScalingPhase.WAITING_FOR_BROKERS,
            desired,
            "Creating",
            f"creating the StatefulSet with {desired} brokers",
        )
    wanted = frozenset(range(desired))
    if desired > current:
        return _step(
            ScalingPhase.WAITING_FOR_BROKERS,
            desired,
            "ScalingOut",
            f"raising brokers from {current} to {desired}",
        )
    if obs.registered is None:
        return _step(
            obs.previous_phase,
            current,
            "ClusterUnreachable",
            "the Fjord cluster does not answer yet",
        )
    if desired < current:
        return _decide_scale_in(obs, current, wanted)
    missing = sorted(wanted - obs.registered)
    if missing:
        return _step(
            ScalingPhase.WAITING_FOR_BROKERS,
            current,
            "WaitingForBrokers",
            f"waiting for brokers {missing} to register",
        )
    if obs.reassigning:
        phase = (
            ScalingPhase.REBALANCING
            if obs.previous_phase in (ScalingPhase.WAITING_FOR_BROKERS, ScalingPhase.REBALANCING)
            else obs.previous_phase
        )
        return _step(
            phase,
            current,
            "ReassignmentInProgress",
            f"{len(obs.reassigning)} partition reassignments running",
        )
    if obs.previous_phase == ScalingPhase.WAITING_FOR_BROKERS or _idle_brokers(obs, wanted):
        # After a scale-out (also when the recorded phase was lost: a broker of the spec holds
        # nothing while there are replicas enough for all), spread partitions onto the new
        # brokers. Otherwise the operator never moves data on its own.
        plan = (
            plan_reassignment(obs.assignment, wanted, racks=obs.racks) if obs.assignment else {}
        )
        if plan:
            return _step(
                ScalingPhase.REBALANCING,
                current,
                "Rebalancing",
                f"moving {len(plan)} partitions onto the new brokers",
                reassign=plan,
            )
    on_others = sorted({b for replicas in obs.assignment.values() for b in replicas} - wanted)
    if on_others:
        # Brokers beyond the spec still hold replicas (e.g. a drain was interrupted by a
        # spec change back): nothing to shrink, report it.
        return _step(
            ScalingPhase.STABLE,
            current,
            "ReplicasOutsideSpec",
            f"brokers {on_others} outside 0..{desired - 1} still hold replicas",
            done=True,
        )
    return _step(
        ScalingPhase.STABLE,
        current,
        "Ready",
        f"{desired} brokers registered",
        done=True,
    )


def _idle_brokers(obs: ClusterObservation, wanted: frozenset[int]) -> list[int]:
    """Brokers of the spec that hold no replica although there are at least as many replicas
    as brokers (a balanced cluster has none)."""
    held = Counter(b for replicas in obs.assignment.values() for b in replicas)
    if sum(held[b] for b in wanted) < len(wanted):
        return []
    return sorted(b for b in wanted if held[b] == 0)


def _decide_scale_in(
    obs: ClusterObservation, current: int, wanted: frozenset[int]
) -> ScalingDecision:
    going = frozenset(range(obs.desired, current))
    assert obs.registered is not None
    too_big = {
        topic: rf for topic, rf in replication_factors(obs.assignment).items() if rf > len(wanted)
    }
    if too_big:
        topic, rf = max(too_big.items(), key=lambda item: (item[1], item[0]))
        return _step(
            ScalingPhase.REFUSED,
            current,
            "ScaleInWouldBreakReplication",
            f"cannot scale in to {obs.desired} brokers: topic {topic!r} has replication "
            f"factor {rf} ({len(too_big)} topics need more brokers than remain)",
            refused=True,
        )
    missing = sorted(wanted - obs.registered)
    if missing:
        return _step(
            ScalingPhase.DRAINING,
            current,
            "WaitingForBrokers",
            f"waiting for brokers {missing} to register before draining {sorted(going)}",
        )
    if obs.reassigning:
        return _step(
            ScalingPhase.DRAINING,
            current,
            "Draining",
            f"{len(obs.reassigning)} partition reassignments running; draining {sorted(going)}",
        )
    holding = {key for key, replicas in obs.assignment.items() if going & set(replicas)}
    if holding:
        try:
            plan = plan_reassignment(
                obs.assignment, wanted | going, drain=going, racks=obs.racks
            )
        except InvalidReplicationFactorError as exc:  # checked above; kept as a clear refusal
            return _step(
                ScalingPhase.REFUSED,
                current,
                "ScaleInWouldBreakReplication",
                str(exc),
                refused=True,
            )
        return _step(
            ScalingPhase.DRAINING,
            current,
            "Draining",
            f"moving {len(holding)} partitions off brokers {sorted(going)}",
            reassign=plan,
        )
    return _step(
        ScalingPhase.SHRINKING,
        obs.desired,
        "Shrinking",
        f"brokers {sorted(going)} drained; shrinking from {current} to {obs.desired}",
    )


# -- rolling restarts of brokers ----------------------------------------------------------------

#: The label the StatefulSet controller puts on each pod: the template revision it was made from.
POD_REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True, slots=True)
class RollTargets:
    """Which brokers a rolling change still has to restart and which do not serve now.
    ``to_restart``: ordinals whose pod was made from an older template revision than the
    StatefulSet's ``updateRevision`` (ordinal order). ``not_serving``: ordinals whose pod is
    missing, terminating or not Ready (the planner counts them as down). ``settled``: False
    while the StatefulSet controller has not yet observed the latest template (its
    ``updateRevision`` may be stale): nothing is restarted then."""

    to_restart: tuple[int, ...]
    not_serving: frozenset[int]
    settled: bool
    update_revision: str | None


def roll_targets(
    statefulset: Mapping[str, object], pods: Sequence[Mapping[str, object]], replicas: int
) -> RollTargets:
    """:class:`RollTargets` of the broker StatefulSet (``OnDelete``: the operator, not the
    StatefulSet controller, restarts pods, one at a time through the rolling-restart planner)
    and its pods, both as the API returns them; ordinals >= ``replicas`` are ignored."""
    meta = statefulset.get("metadata") or {}
    status = statefulset.get("status") or {}
    assert isinstance(meta, Mapping) and isinstance(status, Mapping)
    revision = status.get("updateRevision")
    settled = revision is not None and int(status.get("observedGeneration") or 0) >= int(
        meta.get("generation") or 0
    )
    to_restart: list[int] = []
    seen: set[int] = set()
    not_serving: set[int] = set()
    for pod in pods:
        pod_meta = pod.get("metadata") or {}
        assert isinstance(pod_meta, Mapping)
        try:
            ordinal = int(str(pod_meta.get("name", "")).rsplit("-", 1)[1])
        except (IndexError, ValueError):
            continue
        if ordinal >= replicas:
            continue
        seen.add(ordinal)
        labels = pod_meta.get("labels") or {}
        assert isinstance(labels, Mapping)
        if settled and labels.get(POD_REVISION_LABEL) != revision:
            to_restart.append(ordinal)
        pod_status = pod.get("status") or {}
        assert isinstance(pod_status, Mapping)
        conditions = pod_status.get("conditions") or []
        assert isinstance(conditions, list)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if pod_meta.get("deletionTimestamp") or not ready:
            not_serving.add(ordinal)
    not_serving.update(set(range(replicas)) - seen)
    return RollTargets(
        tuple(sorted(to_restart)),
        frozenset(not_serving),
        settled,
        str(revision) if revision else None,
    )


# -- racks from node labels ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RackPlan:
    """``patches``: pod name -> the rack to write into its ``fjord.io/rack`` annotation;
    ``racks``: broker id -> rack, every scheduled broker pod whose node has the label;
    ``missing``: why a scheduled pod has no rack (its broker waits at start)."""

    patches: Mapping[str, str]
    racks: Mapping[int, str]
    missing: tuple[str, ...]


def rack_annotations(
    pods: Sequence[Mapping[str, object]],
    node_labels: Mapping[str, Mapping[str, str]],
    topology_key: str,
    annotation: str,
) -> RackPlan:
    """The rack each scheduled broker pod gets: the ``topology_key`` label of its node
    (``node_labels``: node name -> labels, for the nodes of these pods). Pods not yet
    scheduled or terminating are left alone; a pod whose annotation already holds its rack
    needs no patch."""
    patches: dict[str, str] = {}
    racks: dict[int, str] = {}
    missing: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
        name = str(meta.get("name", ""))
        node = spec.get("nodeName")
        if not node or meta.get("deletionTimestamp"):
            continue
        rack = (node_labels.get(str(node)) or {}).get(topology_key)
        if not rack:
            missing.append(f"node {node} of pod {name} has no label {topology_key}")
            continue
        try:
            racks[int(name.rsplit("-", 1)[1])] = rack
        except (IndexError, ValueError):
            continue
        current = (meta.get("annotations") or {})
        assert isinstance(current, Mapping)
        if current.get(annotation) != rack:
            patches[name] = rack
    return RackPlan(patches, racks, tuple(missing))


# -- topics -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicObservation:
    """A topic as Fjord has it: partition count, largest replica count, topic-level config
    (only keys set on the topic, not defaults), id."""

    partitions: int
    replication_factor: int
    config: Mapping[str, str]
    topic_id: str = ""


@dataclass(frozen=True, slots=True)
class AutoscalingPolicy:
    """``spec.autoscaling``. Invariant: 1 <= min_partitions <= max_partitions."""

    min_partitions: int
    max_partitions: int
    target_bytes_per_second_per_partition: int
    stabilization_window_s: float


@dataclass(frozen=True, slots=True)
class TopicDecision:
    """What to do for a FjordTopic. ``create``: create with ``partitions`` and the config in
    ``config_changes``;
    ``grow_to``: new total partitions (None: keep); ``config_changes``: key -> value, None
    resets a key; ``replication_factor``: a new replication factor (None: keep). ``error``:
    a refusal (reason, message) shown as the Error condition; other steps still apply."""

    create: bool = False
    partitions: int = 0
    grow_to: int | None = None
    config_changes: Mapping[str, str | None] = field(default_factory=dict)
    replication_factor: int | None = None
    error: tuple[str, str] | None = None

    @property
    def changes_anything(self) -> bool:
        return bool(self.create or self.grow_to or self.config_changes or self.replication_factor)


def autoscaling_policy(spec: Mapping[str, object]) -> AutoscalingPolicy | None:
    """The policy of an enabled ``spec.autoscaling`` (None when absent or disabled)."""
    raw = spec.get("autoscaling")
    if not isinstance(raw, Mapping) or not raw.get("enabled"):
        return None
    partitions = int(spec.get("partitions", 1))  # type: ignore[call-overload]
    return AutoscalingPolicy(
        min_partitions=int(raw.get("minPartitions", partitions)),
        max_partitions=int(raw.get("maxPartitions", partitions)),
        target_bytes_per_second_per_partition=int(raw.get("targetBytesPerSecondPerPartition", 1)),
        stabilization_window_s=float(
            raw.get("stabilizationWindowSeconds", DEFAULT_STABILIZATION_WINDOW_S)
        ),
    )


def topic_spec_problems(spec: Mapping[str, object]) -> list[str]:
    """What the CRD schema cannot check in a FjordTopic spec."""
    problems = []
    policy = autoscaling_policy(spec)
    if policy is not None:
        if policy.min_partitions > policy.max_partitions:
            problems.append(
                f"spec.autoscaling.minPartitions {policy.min_partitions} exceeds maxPartitions "
                f"{policy.max_partitions}"
            )
        lag = time_lag_policy(spec)
        if lag is not None and not lag.group:
            problems.append("spec.autoscaling.timeLag.group is empty")
        if lag is not None and lag.target_seconds <= 0:
            problems.append(
                "spec.autoscaling.timeLag.targetSeconds must be above 0, got "
                f"{lag.target_seconds:g}"
            )
        partitions = spec.get("partitions")
        if isinstance(partitions, int) and partitions > policy.max_partitions:
            problems.append(
                f"spec.partitions {partitions} exceeds spec.autoscaling.maxPartitions "
                f"{policy.max_partitions}"
            )
    return problems


def decide_topic(
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str],
    actual: TopicObservation | None,
    autoscaling: AutoscalingPolicy | None = None,
) -> TopicDecision:
    """Bring the topic to the spec: create it, grow its partitions, set config drift back,
    change its replication factor. Partitions never shrink: a spec below the actual count is
    refused (PartitionDecreaseRefused), unless autoscaling grew it within its bounds (the
    autoscaler owns counts between spec.partitions and maxPartitions)."""
    floor = partitions if autoscaling is None else max(partitions, autoscaling.min_partitions)
    if actual is None:
        return TopicDecision(
            create=True, partitions=floor, config_changes={k: str(v) for k, v in config.items()}
        )
    error: tuple[str, str] | None = None
    grow_to = floor if floor > actual.partitions else None
    autoscaled = autoscaling is not None and actual.partitions <= autoscaling.max_partitions
    if actual.partitions > floor and not autoscaled:
        error = (
            "PartitionDecreaseRefused",
            f"spec.partitions is {partitions} but the topic has {actual.partitions}: Fjord "
            "partitions never shrink (records are spread over them); delete and re-create the "
            "topic to have fewer",
        )
    changes: dict[str, str | None] = {
        key: str(value) for key, value in config.items() if actual.config.get(key) != str(value)
    }
    changes.update({key: None for key in actual.config if key not in config})
    return TopicDecision(
        grow_to=grow_to,
        config_changes=changes,
        replication_factor=(
            replication_factor if replication_factor != actual.replication_factor else None
        ),
        error=error,
    )


# -- autoscaling ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IngressSample:
    """At ``time_s`` (wall-clock seconds since the epoch, so that samples outlive the operator
    process) the topic had received ``total_bytes`` in all (a counter: the brokers' bytes in, or
    the sum of its partitions' log-end offsets times the bytes per record).

    ``min_rate``: set when samples between the previous one and this one were merged away
    (:func:`bound_samples`): the lowest rate (bytes/s) of the intervals it replaces. None: the
    rate since the previous sample is the counter's difference over the time's."""

    time_s: float
    total_bytes: float
    min_rate: float | None = None


def rate_between(earlier: IngressSample, later: IngressSample) -> float | None:
    """The rate (bytes/s) judged for the interval ending at ``later``; None when the clock did
    not advance (a wall clock set back)."""
    if later.time_s <= earlier.time_s:
        return None
    if later.min_rate is not None:
        return later.min_rate
    return (later.total_bytes - earlier.total_bytes) / (later.time_s - earlier.time_s)


def bound_samples(
    samples: Sequence[IngressSample], max_samples: int = MAX_AUTOSCALING_SAMPLES
) -> list[IngressSample]:
    """At most ``max_samples`` (>= 3) samples: while there are more, the second oldest is merged
    away; the next one then carries the lower of the two rates it spanned (``min_rate``). The
    first and last samples, the window's coverage and the lowest rate stay as they were, so a
    bounded window never grows a topic the full one would not have grown."""
    if max_samples < 3:
        raise ValueError("max_samples must be at least 3")
    kept = list(samples)
    while len(kept) > max_samples:
        first, dropped, after = kept[0], kept[1], kept[2]
        rates = [
            r for r in (rate_between(first, dropped), rate_between(dropped, after)) if r is not None
        ]
        merged = IngressSample(after.time_s, after.total_bytes, min(rates) if rates else None)
        kept[1:3] = [merged]
    return kept


def samples_to_status(source: str, samples: Sequence[IngressSample]) -> dict[str, object]:
    """``status.autoscaling`` of a FjordTopic: the measuring source and the window's samples
    (``time`` epoch seconds, ``bytes`` the counter, ``minRate`` when merged), at most
    MAX_AUTOSCALING_SAMPLES of them."""
    out: list[dict[str, float]] = []
    for sample in bound_samples(samples):
        item = {"time": round(sample.time_s, 3), "bytes": sample.total_bytes}
        if sample.min_rate is not None:
            item["minRate"] = sample.min_rate
        out.append(item)
    return {"source": source, "samples": out}


def samples_from_status(status: Mapping[str, object] | None, source: str) -> list[IngressSample]:
    """The samples a FjordTopic's status carries for ``source`` (an operator restarted mid-window
    continues with them). Anything else — no status, another source (a new window), a
    malformed entry (the status is anyone's to edit) — gives no samples: a new window."""
    raw = (status or {}).get("autoscaling")
    if not isinstance(raw, Mapping) or raw.get("source") != source:
        return []
    items = raw.get("samples")
    if not isinstance(items, list):
        return []
    out: list[IngressSample] = []
    for item in items:
        if not isinstance(item, Mapping):
            return []
        time_s, total = _number(item.get("time")), _number(item.get("bytes"))
        min_rate = _number(item.get("minRate"))
        if time_s is None or total is None or (min_rate is None and "minRate" in item):
            return []
        out.append(IngressSample(time_s, total, min_rate))
    return bound_samples(out)


def _number(value: object) -> float | None:
    """``value`` as a float if it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def prune_samples(
    samples: Sequence[IngressSample], now_s: float, window_s: float
) -> list[IngressSample]:
    """The samples still needed: those inside the window plus the last one at or before its
    start (the start of the first rate), and never fewer than the last two. A counter going
    backwards (a topic re-created) drops the older samples."""
    kept: list[IngressSample] = []
    for sample in samples:
        if kept and sample.total_bytes < kept[-1].total_bytes:
            kept = []
        kept.append(sample)
    start = now_s - window_s
    first = 0
    for i, sample in enumerate(kept):
        if sample.time_s <= start:
            first = i
    # Keep at least the last two samples (one rate): a zero window judges the latest rate.
    return kept[max(0, min(first, len(kept) - 2)) :]


def decide_autoscale(
    samples: Sequence[IngressSample],
    partitions: int,
    policy: AutoscalingPolicy,
    now_s: float,
) -> int | None:
    """The new partition count, or None to keep ``partitions``.

    Grows only when the samples cover the whole stabilization window and every rate in it
    (between consecutive samples) per partition exceeded the target: then to the count that
    brings the smallest of those rates to the target, at least one more, at most
    ``max_partitions``. Never shrinks. A window of 0 needs two samples."""
    if partitions >= policy.max_partitions:
        return None
    window = prune_samples(samples, now_s, policy.stabilization_window_s)
    if len(window) < 2 or window[0].time_s > now_s - policy.stabilization_window_s:
        return None
    rates = [
        rate for a, b in itertools.pairwise(window) if (rate := rate_between(a, b)) is not None
    ]
    if not rates:
        return None
    sustained = min(rates)
    target = policy.target_bytes_per_second_per_partition
    if sustained / partitions <= target:
        return None
    needed = math.ceil(sustained / target)
    return min(policy.max_partitions, max(partitions + 1, needed))


def topic_bytes_in(metrics_pages: Sequence[str], topic: str) -> float:
    """Bytes produced to ``topic`` so far: the sum over brokers of their per-topic bytes-in
    counter (``fjord_broker_bytes_in``, counted by each partition's leader) in Prometheus text
    pages. A broker restart lowers the sum; :func:`prune_samples` then starts a new window."""
    from prometheus_client.parser import text_string_to_metric_families

    from fjord.observability.metrics import BROKER_BYTES_IN

    sample_name = f"{next(iter(BROKER_BYTES_IN.describe())).name}_total"
    total = 0.0
    for page in metrics_pages:
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == sample_name and sample.labels.get("topic") == topic:
                    total += sample.value
    return total


# -- autoscaling on time lag -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeLagPolicy:
    """``spec.autoscaling.timeLag``: the consumer group whose time lag on this topic should
    stay under ``target_seconds``. Invariant: target_seconds > 0."""

    group: str
    target_seconds: float


def time_lag_policy(spec: Mapping[str, object]) -> TimeLagPolicy | None:
    """The time-lag target of an enabled ``spec.autoscaling`` (None when not given)."""
    raw = spec.get("autoscaling")
    if not isinstance(raw, Mapping) or not raw.get("enabled"):
        return None
    lag = raw.get("timeLag")
    if not isinstance(lag, Mapping):
        return None
    return TimeLagPolicy(str(lag.get("group", "")), float(lag.get("targetSeconds", 0)))


@dataclass(frozen=True, slots=True)
class GroupLagSample:
    """At ``time_s`` (epoch seconds): the group's committed offsets and the log end offsets,
    each summed over the topic's partitions, the worst partition's time lag (None: unknown)
    and the group's member count."""

    time_s: float
    committed: int
    log_end: int
    time_lag_s: float | None
    members: int


@dataclass(frozen=True, slots=True)
class TimeLagVerdict:
    """What the time-lag autoscaler concluded. ``consumers_to_catch_up``: how many consumers
    (at the rate each one consumed over the window) would keep up with the producers and clear
    the backlog within the target (None: unknown — fewer than two samples, or the group
    consumed nothing in the window, so no rate per consumer is known). ``grow_to``: the new
    partition count (None: keep). ``reason``: one sentence for the status."""

    time_lag_s: float | None
    consumers: int
    consumers_to_catch_up: int | None
    grow_to: int | None
    reason: str


def decide_time_lag(
    samples: Sequence[GroupLagSample],
    partitions: int,
    policy: AutoscalingPolicy,
    target: TimeLagPolicy,
    now_s: float,
) -> TimeLagVerdict:
    """Kafka's consumers cannot outnumber partitions usefully (each partition has one reader in
    a group), so a group whose time lag stays above its target needs more consumers and, once
    it would need more consumers than there are partitions, more partitions.

    Over the samples of the stabilization window: produced = log-end growth / time, consumed =
    committed growth / time, per consumer = consumed / max(members, 1) (a Spark query reports
    with no members: one reader); needed = produced + backlog / target_seconds;
    consumers_to_catch_up = ceil(needed / per consumer). The topic grows (to that count, at
    most ``max_partitions``, never shrinking) only when every sample of a window that the
    samples fully cover had a time lag above the target and the group made progress (more
    partitions do not help a group that is stuck)."""
    window = _lag_window(samples, now_s, policy.stabilization_window_s)
    last = window[-1] if window else None
    time_lag = None if last is None else last.time_lag_s
    consumers = 0 if last is None else last.members
    if last is None or len(window) < 2:
        return TimeLagVerdict(time_lag, consumers, None, None, "measuring the group's rates")
    first = window[0]
    elapsed = last.time_s - first.time_s
    consumed = (last.committed - first.committed) / elapsed if elapsed > 0 else 0.0
    produced = max(last.log_end - first.log_end, 0) / elapsed if elapsed > 0 else 0.0
    backlog = max(last.log_end - last.committed, 0)
    if consumed <= 0:
        needed: int | None = None
    else:
        per_consumer = consumed / max(last.members, 1)
        needed = max(math.ceil((produced + backlog / target.target_seconds) / per_consumer), 1)
    covered = first.time_s <= now_s - policy.stabilization_window_s
    above = all(s.time_lag_s is not None and s.time_lag_s > target.target_seconds for s in window)
    if not (covered and above):
        reason = f"time lag within {target.target_seconds:g} s (or not above it for the window)"
        return TimeLagVerdict(time_lag, consumers, needed, None, reason)
    if needed is None:
        reason = "time lag above target but the group consumed nothing in the window"
        return TimeLagVerdict(time_lag, consumers, None, None, reason)
    if needed <= partitions or partitions >= policy.max_partitions:
        reason = (
            f"{needed} consumers would catch up within {target.target_seconds:g} s"
            + (" (at maxPartitions)" if needed > partitions else "")
        )
        return TimeLagVerdict(time_lag, consumers, needed, None, reason)
    grow_to = min(policy.max_partitions, needed)
    reason = f"growing to {grow_to} partitions: {needed} consumers would catch up"
    return TimeLagVerdict(time_lag, consumers, needed, grow_to, reason)


def _lag_window(
    samples: Sequence[GroupLagSample], now_s: float, window_s: float
) -> list[GroupLagSample]:
    """The samples inside the window plus the last one at or before its start (never fewer
    than the last two); a committed or log-end sum going backwards (a reset, a re-created
    topic) drops the older samples."""
    kept: list[GroupLagSample] = []
    for sample in samples:
        if kept and (sample.committed < kept[-1].committed or sample.log_end < kept[-1].log_end):
            kept = []
        kept.append(sample)
    first = 0
    for i, sample in enumerate(kept):
        if sample.time_s <= now_s - window_s:
            first = i
    return kept[max(0, min(first, len(kept) - 2)) :][-MAX_AUTOSCALING_SAMPLES:]


def lag_samples_to_status(
    target: TimeLagPolicy, samples: Sequence[GroupLagSample], verdict: TimeLagVerdict
) -> dict[str, object]:
    """``status.autoscaling.timeLag``: the verdict (how many consumers would catch up) and the
    window's samples (at most MAX_AUTOSCALING_SAMPLES), from which a restarted operator goes
    on."""
    return {
        "group": target.group,
        "targetSeconds": target.target_seconds,
        "timeLagSeconds": verdict.time_lag_s,
        "consumers": verdict.consumers,
        "consumersToCatchUp": verdict.consumers_to_catch_up,
        "message": verdict.reason,
        "samples": [
            {
                "time": round(s.time_s, 3),
                "committed": s.committed,
                "logEnd": s.log_end,
                "timeLagSeconds": s.time_lag_s,
                "members": s.members,
            }
            for s in list(samples)[-MAX_AUTOSCALING_SAMPLES:]
        ],
    }


def lag_samples_from_status(
    status: Mapping[str, object] | None, target: TimeLagPolicy
) -> list[GroupLagSample]:
    """The samples a FjordTopic's status carries for ``target``'s group (none for another
    group, or anything malformed: a new window)."""
    raw = (status or {}).get("autoscaling")
    lag = raw.get("timeLag") if isinstance(raw, Mapping) else None
    if not isinstance(lag, Mapping) or lag.get("group") != target.group:
        return []
    items = lag.get("samples")
    if not isinstance(items, list):
        return []
    out: list[GroupLagSample] = []
    for item in items:
        if not isinstance(item, Mapping):
            return []
        time_s, committed, log_end = (
            _number(item.get("time")), _number(item.get("committed")), _number(item.get("logEnd"))
        )
        members, seconds = _number(item.get("members")), _number(item.get("timeLagSeconds"))
        if time_s is None or committed is None or log_end is None or members is None:
            return []
        out.append(GroupLagSample(time_s, int(committed), int(log_end), seconds, int(members)))
    return out
