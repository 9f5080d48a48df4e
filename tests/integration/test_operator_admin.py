"""The operator's Fjord shell (:class:`fjord_operator.handlers.FjordAdmin`) against the shared
real local cluster: observe, create, grow, set config drift back, drain a broker by
reassignment, measure ingress, delete. Each test uses its own topic names."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from fjord.client import Producer
from fjord.cluster.reassignment_plan import plan_reassignment
from fjord.testing.waiting import wait_for_async
from fjord_operator.decisions import TopicObservation, decide_topic
from fjord_operator.handlers import FjordAdmin

pytestmark = pytest.mark.integration

WAIT_S = 60.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_topic_lifecycle_through_the_operator_shell(bootstrap: str) -> None:
    name = unique("op-topic")

    async def scenario() -> None:
        admin = FjordAdmin(bootstrap, timeout_s=30)
        try:
            assert await admin.observe_topic(name) is None
            create = decide_topic(2, 2, {"retention.ms": "3600000"}, None)
            await admin.apply_topic(name, create, 2)
            # The brokers' metadata (what observe_topic reads) follows the controller shortly.
            actual = await observed(admin, name, lambda t: t.partitions == 2)
            assert actual.replication_factor == 2
            assert actual.config == {"retention.ms": "3600000"}
            assert actual.topic_id

            # Someone changed the config out of band and the spec asks for 4 partitions.
            await asyncio.to_thread(
                admin._client().alter_configs,
                {name: {"retention.ms": "5", "segment.ms": "60000"}},
            )
            drifted = await admin.observe_topic(name)
            decision = decide_topic(4, 2, {"retention.ms": "3600000"}, drifted)
            assert decision.config_changes == {"retention.ms": "3600000", "segment.ms": None}
            await admin.apply_topic(name, decision, 2)
            fixed = await observed(admin, name, lambda t: t.partitions == 4)
            assert fixed.config == {"retention.ms": "3600000"}

            # A decrease is refused by the decision; nothing reaches Fjord.
            refused = decide_topic(3, 2, {"retention.ms": "3600000"}, fixed)
            assert refused.error is not None and not refused.changes_anything

            # Ingress: the sum of log-end offsets counts every record produced.
            assert await admin.records_appended(name, 4) == 0
            with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
                for i in range(25):
                    producer.send(name, key=f"k{i}", value=b"x" * 10)
                producer.flush()
            assert await admin.records_appended(name, 4) == 25

            await admin.delete_topic(name)
            await wait_for_async(
                lambda: _absent(admin, name), f"{name} deleted", WAIT_S, interval=0.2
            )
            await admin.delete_topic(name)  # idempotent: the finalizer may run twice
        finally:
            await asyncio.to_thread(admin.close)

    asyncio.run(scenario())


async def observed(
    admin: FjordAdmin, name: str, condition: Callable[[TopicObservation], bool]
) -> TopicObservation:
    """The topic as soon as ``condition`` holds for it (bounded)."""
    seen: list[TopicObservation] = []

    async def check() -> bool:
        topic = await admin.observe_topic(name)
        if topic is not None and condition(topic):
            seen.append(topic)
            return True
        return False

    await wait_for_async(check, f"{name} to match", WAIT_S, interval=0.2)
    return seen[-1]


async def reconcile_until_settled(rt: Any, topic: dict[str, Any], *, autoscale: bool) -> Any:
    """reconcile_topic until it stops asking for a retry (a topic just created may not be in
    the brokers' metadata yet: Reconciling/Creating)."""
    from fjord_operator.handlers import reconcile_topic

    return await wait_for_async(
        lambda: reconcile_topic(rt, topic, autoscale=autoscale),
        "the reconcile to settle",
        WAIT_S,
        interval=0.2,
        accept=lambda plan: not plan.retry,
    )


async def _absent(admin: FjordAdmin, name: str) -> bool:
    return await admin.observe_topic(name) is None


def test_drain_a_broker_by_reassignment(bootstrap: str) -> None:
    """What a scale-in does, on one topic of the shared cluster: plan with ``drain``, submit,
    wait until no reassignment runs and broker 2 holds none of the topic's replicas."""
    name = unique("op-drain")

    async def scenario() -> None:
        admin = FjordAdmin(bootstrap, timeout_s=30)
        try:
            create = decide_topic(3, 2, {}, None)
            await admin.apply_topic(name, create, 2)
            await observed(admin, name, lambda t: t.partitions == 3)
            registered, assignment, _ = await admin.observe_cluster()
            assert registered >= {0, 1, 2}
            mine = {k: v for k, v in assignment.items() if k[0] == name}
            assert len(mine) == 3 and any(2 in r for r in mine.values())
            plan = plan_reassignment(mine, {0, 1, 2}, drain={2})
            await admin.reassign(plan)

            async def drained() -> bool:
                _, now, moving = await admin.observe_cluster()
                ours = {k: v for k, v in now.items() if k[0] == name}
                return not any(k[0] == name for k in moving) and all(
                    2 not in r for r in ours.values()
                )

            await wait_for_async(drained, f"broker 2 drained of {name}", WAIT_S, interval=0.2)
            _, after, _ = await admin.observe_cluster()
            assert all(len(after[(name, p)]) == 2 for p in range(3))
            await admin.delete_topic(name)
        finally:
            await asyncio.to_thread(admin.close)

    asyncio.run(scenario())


def test_reconcile_through_kmock_and_the_real_cluster(bootstrap: str) -> None:
    """The handler functions kopf calls, without kopf: Kubernetes is kmock's emulator, Fjord
    is the shared real cluster (reached through the bootstrap annotation)."""
    import kmock

    from fjord_operator.handlers import (
        KubeApi,
        Runtime,
        finalize_topic,
        plan_cluster,
        reconcile_cluster,
        reconcile_topic,
    )
    from fjord_operator.settings import OperatorSettings

    name = unique("op-kmock")

    async def scenario() -> None:
        async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s) as server:
            url = str(server.url)
            rt = Runtime(OperatorSettings(kube_server=url, admin_timeout_s=30), KubeApi(url))
            try:
                cluster = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordCluster",
                    "metadata": {
                        "name": "c",
                        "namespace": "ns",
                        "uid": "uid-c",
                        "generation": 1,
                        "annotations": {"fjord.io/bootstrap-servers": bootstrap},
                    },
                    "spec": {"brokers": {"replicas": 3}, "etcd": {"endpoints": ["http://e:1"]}},
                }
                assert await rt.kube.apply(cluster) == "created"
                assert await rt.kube.apply(cluster) == "unchanged"
                first = await reconcile_cluster(rt, cluster)
                assert first.status["scaling"]["phase"] == "WaitingForBrokers" and first.retry
                sts = await rt.kube.get("apps/v1", "StatefulSet", "ns", "c-broker")
                assert sts is not None and sts["spec"]["replicas"] == 3
                # The next pass plans from the real cluster's state. It is planned here, not
                # applied: a rebalance would move other tests' partitions on the shared cluster.
                registered, assignment, moving = await rt.admin(bootstrap).observe_cluster()
                stable = {**first.status, "scaling": {"phase": "Stable"}}
                second = plan_cluster(
                    {**cluster, "status": stable},
                    3,
                    3,
                    registered,
                    assignment,
                    moving,
                    datetime.now(UTC),
                )
                ready = {c["type"]: c["status"] for c in second.status["conditions"]}
                if not moving:
                    assert ready == {"Ready": "True", "Reconciling": "False", "Error": "False"}
                    assert not second.reassign and not second.retry
                assert second.status["brokers"] >= 3

                topic = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordTopic",
                    "metadata": {"name": name, "namespace": "ns", "uid": "uid-t", "generation": 1},
                    "spec": {
                        "cluster": "c",
                        "partitions": 3,
                        "replicationFactor": 2,
                        "config": {"retention.ms": "60000"},
                    },
                }
                created = await reconcile_until_settled(rt, topic, autoscale=False)
                assert created.status["partitions"] == 3 and created.status["topicId"]
                assert created.status["conditions"][0]["status"] == "True"
                topic["spec"]["partitions"] = 2
                refused = await reconcile_topic(rt, topic)
                error = refused.status["conditions"][2]
                assert (error["status"], error["reason"]) == ("True", "PartitionDecreaseRefused")
                assert refused.status["partitions"] == 3
                topic["spec"]["cluster"] = "missing"
                lost = await reconcile_topic(rt, topic)
                assert lost.status["conditions"][2]["reason"] == "ClusterNotFound" and lost.retry
                topic["spec"]["cluster"] = "c"
                await finalize_topic(rt, topic)
                admin = rt.admin(bootstrap)
                await wait_for_async(
                    lambda: _absent(admin, name), f"{name} deleted", WAIT_S, interval=0.2
                )
            finally:
                await rt.close()

    asyncio.run(scenario())


def test_autoscaling_grows_a_topic_from_real_ingress(local_cluster, bootstrap: str) -> None:  # type: ignore[no-untyped-def]
    """Two timer passes with records produced in between: the brokers' per-topic bytes-in
    counters (scraped from their /metrics) show ingress above the target, and the topic grows
    within maxPartitions. Without the metrics annotation, ingress is measured in records."""
    import kmock

    from fjord_operator.handlers import KubeApi, Runtime, measure_ingress, reconcile_topic
    from fjord_operator.settings import OperatorSettings

    name = unique("op-auto")
    metrics = ",".join(local_cluster.metrics_address("broker", b) for b in range(3))

    def produce(count: int) -> None:
        with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
            for i in range(count):
                producer.send(name, key=f"k{i}", value=b"v" * 100)
            producer.flush()

    async def scenario() -> None:
        async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s) as server:
            url = str(server.url)
            rt = Runtime(OperatorSettings(kube_server=url, admin_timeout_s=30), KubeApi(url))
            try:
                annotations = {
                    "fjord.io/bootstrap-servers": bootstrap,
                    "fjord.io/broker-metrics": metrics,
                }
                cluster = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordCluster",
                    "metadata": {"name": "c", "namespace": "ns", "annotations": annotations},
                    "spec": {"brokers": {"replicas": 3}, "etcd": {"endpoints": ["http://e:1"]}},
                }
                await rt.kube.apply(cluster)
                topic = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordTopic",
                    "metadata": {"name": name, "namespace": "ns", "uid": "uid-a", "generation": 1},
                    "spec": {
                        "cluster": "c",
                        "partitions": 2,
                        "replicationFactor": 1,
                        "autoscaling": {
                            "enabled": True,
                            "minPartitions": 2,
                            "maxPartitions": 5,
                            "targetBytesPerSecondPerPartition": 1,
                            "stabilizationWindowSeconds": 0,
                        },
                    },
                }
                first = await reconcile_until_settled(rt, topic, autoscale=True)
                assert first.status["partitions"] == 2
                produce(30)
                admin = rt.admin(bootstrap)
                source, total = await measure_ingress(rt, cluster, topic, admin, name, 2)
                assert source == "metrics" and total >= 30 * 100
                grown = await reconcile_topic(rt, topic, autoscale=True)
                assert grown.status["conditions"][0]["status"] == "True"

                async def partitions_now() -> int:
                    observed = await admin.observe_topic(name)
                    return observed.partitions if observed is not None else 0

                async def more_than_two() -> bool:  # the brokers' metadata follows the grow
                    return await partitions_now() > 2

                await wait_for_async(more_than_two, f"{name} grown", WAIT_S, interval=0.2)
                partitions = await partitions_now()
                assert partitions <= 5

                external = {**cluster, "metadata": {**cluster["metadata"]}}
                external["metadata"]["annotations"] = {"fjord.io/bootstrap-servers": bootstrap}
                source, total = await measure_ingress(rt, external, topic, admin, name, partitions)
                assert (source, total) == ("records", 30 * 1024)
                await admin.delete_topic(name)
            finally:
                await rt.close()

    asyncio.run(scenario())


def test_time_lag_autoscaling_tells_consumers_and_grows(  # type: ignore[no-untyped-def]
    local_cluster, bootstrap: str
) -> None:
    """A group an hour behind on a 1-partition topic, consuming 10 records between two timer
    passes while 990 wait: the first pass measures (status.autoscaling.timeLag: the group's time
    lag, its members, no count yet); the second finds the time lag above the 1 s target and
    grows the topic to as many partitions as consumers would catch up, capped at 4."""
    import time

    import kmock

    from fjord.client import AdminClient, TopicPartition
    from fjord_operator.handlers import KubeApi, Runtime
    from fjord_operator.settings import OperatorSettings

    name, group = unique("op-lag"), unique("op-lag-group")
    hour_ago_ms = int(time.time() * 1000) - 3_600_000

    async def scenario() -> None:
        async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s) as server:
            url = str(server.url)
            rt = Runtime(OperatorSettings(kube_server=url, admin_timeout_s=30), KubeApi(url))
            try:
                cluster = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordCluster",
                    "metadata": {
                        "name": "c",
                        "namespace": "ns",
                        "annotations": {"fjord.io/bootstrap-servers": bootstrap},
                    },
                    "spec": {"brokers": {"replicas": 3}, "etcd": {"endpoints": ["http://e:1"]}},
                }
                await rt.kube.apply(cluster)
                topic = {
                    "apiVersion": "fjord.io/v1alpha1",
                    "kind": "FjordTopic",
                    "metadata": {"name": name, "namespace": "ns", "uid": "uid-l", "generation": 1},
                    "spec": {
                        "cluster": "c",
                        "partitions": 1,
                        "replicationFactor": 1,
                        "autoscaling": {
                            "enabled": True,
                            "maxPartitions": 4,
                            "targetBytesPerSecondPerPartition": 10**12,  # ingress never grows it
                            "stabilizationWindowSeconds": 0,
                            "timeLag": {"group": group, "targetSeconds": 1},
                        },
                    },
                }
                created = await reconcile_until_settled(rt, topic, autoscale=False)
                assert created.status["partitions"] == 1
                with Producer({"bootstrap.servers": bootstrap, "linger.ms": 1}) as producer:
                    for i in range(1000):
                        producer.send(name, value=b"v", partition=0, timestamp_ms=hour_ago_ms + i)
                    producer.flush()
                tp = TopicPartition(name, 0)
                with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                    admin.alter_consumer_group_offsets(group, {tp: 0})
                    first = await reconcile_until_settled(rt, topic, autoscale=True)
                    measuring = first.status["autoscaling"]["timeLag"]
                    assert measuring["group"] == group and measuring["consumers"] == 0
                    assert measuring["consumersToCatchUp"] is None
                    assert 3_500 < measuring["timeLagSeconds"] < 3_600 + WAIT_S
                    assert len(measuring["samples"]) == 1
                    # The rates are over the time between the samples: 10 consumed in t seconds
                    # against 990 waiting asks for ceil(99 t) consumers, so the second sample
                    # must come at least 0.1 s after the first (on a quiet machine the two
                    # passes can be 30 ms apart: 3 consumers, and the topic would grow to 3).
                    first_sample_s = measuring["samples"][0]["time"]

                    async def a_tenth_of_a_second_later() -> bool:
                        return time.time() >= first_sample_s + 0.1

                    await wait_for_async(
                        a_tenth_of_a_second_later, "0.1 s after the first sample", WAIT_S,
                        interval=0.02)
                    admin.alter_consumer_group_offsets(group, {tp: 10})
                    second = await reconcile_until_settled(rt, topic, autoscale=True)
                verdict = second.status["autoscaling"]["timeLag"]
                # 990 waiting, 10 consumed in the seconds between the passes by one reader:
                # catching up within 1 s takes ~99 x the pause readers; the topic grows to 4.
                assert verdict["consumersToCatchUp"] >= 4, verdict
                assert verdict["samples"] == []  # a new partition count starts a new window
                admin_ = rt.admin(bootstrap)

                async def grown() -> bool:
                    observed = await admin_.observe_topic(name)
                    return observed is not None and observed.partitions == 4

                await wait_for_async(grown, f"{name} grown to 4", WAIT_S, interval=0.2)
                await admin_.delete_topic(name)
            finally:
                await rt.close()

    asyncio.run(scenario())


def test_a_cluster_that_does_not_answer_holds_up_no_other_clusters_calls(bootstrap: str) -> None:
    """Calls to a cluster that does not answer each wait out the admin's timeout in a worker
    thread; more of them than the loop's shared executor has threads (6 on 2 cores) must not
    hold up another cluster's calls (a real API run: a FjordUser's finalizer waited over 60 s
    behind FjordClusters whose brokers never came up)."""
    unreachable = FjordAdmin("127.0.0.1:9", timeout_s=8)
    reachable = FjordAdmin(bootstrap, timeout_s=30)

    async def scenario() -> None:
        stuck = [asyncio.ensure_future(unreachable.observe_racks()) for _ in range(7)]
        await asyncio.sleep(0)  # one loop turn: each has handed its call to a thread
        try:
            assert await reachable.observe_racks()  # the shared cluster's brokers
            assert not any(call.done() for call in stuck)
        finally:
            await asyncio.gather(*stuck, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        unreachable.close()
        reachable.close()


def test_broker_metrics_that_do_not_answer_fail_in_time_without_threads() -> None:
    """Scraping brokers' /metrics for autoscaling runs on the event loop: a broker that accepts
    and never answers is an OSError after the timeout, as are an HTTP error and a refused
    connection (measure_ingress then counts records instead), and none of it waits for the
    loop's shared executor, held here by a blocked job the whole time."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from fjord_operator.handlers import scrape_metrics

    page = "# TYPE up gauge\nup 1\n"

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; returns when the client gives up

    def answering(status: str, body: str) -> Callable[..., Any]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n{body}".encode()
            )
            await writer.drain()
            writer.close()

        return answer

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        executor = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(executor)
        blocker = loop.run_in_executor(None, release.wait, 60)
        silent_server = await asyncio.start_server(silent, "127.0.0.1", 0)
        http_server = await asyncio.start_server(answering("200 OK", page), "127.0.0.1", 0)
        broken_server = await asyncio.start_server(answering("500 Oops", ""), "127.0.0.1", 0)
        refused = socket_bound_not_listening()
        try:
            silent_at, http_at, broken_at = (
                f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
                for server in (silent_server, http_server, broken_server)
            )
            assert await scrape_metrics([http_at, http_at], 5) == [page, page]
            started = loop.time()
            with pytest.raises(OSError):
                await scrape_metrics([http_at, silent_at], 0.5)
            assert loop.time() - started < 5
            with pytest.raises(OSError, match="500"):
                await scrape_metrics([http_at, broken_at], 5)
            with pytest.raises(OSError):
                await scrape_metrics([f"127.0.0.1:{refused.getsockname()[1]}"], 5)
            assert not blocker.done()
        finally:
            release.set()
            await blocker
            refused.close()
            for server in (silent_server, http_server, broken_server):
                server.close()
                await server.wait_closed()
            executor.shutdown()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def socket_bound_not_listening() -> Any:
    """A TCP socket bound to a free port that does not listen: connecting to it is refused."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock
