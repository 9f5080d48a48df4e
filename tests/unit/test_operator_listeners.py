"""The operator's client doors (fjord_operator.listeners): several Kafka listeners per pod in
Strimzi's style (each its own name, port and authentication) and the SASL gRPC doors; the
pods' commands (run by a real sh and read back by the services' own option parser), ports,
Services, the checks the schema cannot express and what a FjordUser's client.properties
says about where to connect."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from fjord.kafka.listeners import KafkaDoor, resolve_kafka_doors
from fjord.security.certificates import make_ca
from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.listeners import (
    client_bootstrap_hints,
    kafka_listeners,
    sasl_grpc_door_port,
    serves_scram,
)
from fjord_operator.security import plan_user_credentials
from tests.helpers.operator_specs import cluster, flag, run_container_command

TWO_LISTENERS = [
    {"name": "tls", "port": 9095, "authentication": "tls"},
    {"name": "scram", "port": 9096, "authentication": "scram-sha-512"},
]


def secure_cluster(**spec: Any) -> dict[str, Any]:
    security = {"tls": True, "authorization": True, **spec.pop("security", {})}
    return cluster(security=security, **spec)


def objects(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in builders.cluster_objects(
        body, 3, {"broker": "b", "controller": "c", "coordinator": "o"})}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return dict(only)


def ports(obj: dict[str, Any]) -> dict[str, int]:
    if obj["kind"] == "Service":
        return {p["name"]: p["port"] for p in obj["spec"]["ports"]}
    return {p["name"]: p["containerPort"] for p in container(obj)["ports"]}


def doors_of(argv: list[str]) -> tuple[KafkaDoor, ...]:
    """The Kafka doors the services' own parser reads from a pod's flags."""
    protocol_map = (
        flag(argv, "--listener-security-protocol-map")
        if "--listener-security-protocol-map" in argv else ""
    )
    return resolve_kafka_doors(
        flag(argv, "--listen"), flag(argv, "--listeners"), flag(argv, "--advertised-listeners"),
        0, protocol_map,
    )[2]


def test_two_listeners_and_the_sasl_doors_in_every_pod(tmp_path: Path) -> None:
    body = secure_cluster(listeners=TWO_LISTENERS, security={"saslGrpcDoor": {"enabled": True}})
    objs = objects(body)
    broker = objs["StatefulSet/fjord-broker"]
    argv = run_container_command(container(broker)["command"], tmp_path,
                                 HOSTNAME="fjord-broker-1")
    pod = "fjord-broker-1.fjord-broker-headless.fjord.svc"
    assert doors_of(argv) == (
        KafkaDoor("TLS", "SSL", "0.0.0.0", 9095, (pod, 9095)),
        KafkaDoor("SCRAM", "SASL_SSL", "0.0.0.0", 9096, (pod, 9096)),
    )
    assert flag(argv, "--sasl-listen") == f"0.0.0.0:{s.SASL_GRPC_PORT}"
    assert ports(broker) == {"grpc": 9092, "tls": 9095, "scram": 9096,
                             "sasl-grpc": s.SASL_GRPC_PORT, "metrics": 9404}
    for name in ("Service/fjord-broker", "Service/fjord-broker-headless",
                 "Service/fjord-coordinator-headless"):
        assert {k: v for k, v in ports(objs[name]).items() if k != "grpc"} == {
            "tls": 9095, "scram": 9096, "sasl-grpc": s.SASL_GRPC_PORT, "metrics": 9404}
    for name in ("Service/fjord-controller", "Service/fjord-controller-headless"):
        assert ports(objs[name]) == {"grpc": 9093, "sasl-grpc": s.SASL_GRPC_PORT,
                                     "metrics": 9404}
    for role in ("coordinator", "controller"):
        deployment = objs[f"Deployment/fjord-{role}"]
        argv = run_container_command(container(deployment)["command"], tmp_path,
                                     POD_IP="10.1.2.3",
                                     POD_UID="0a1b2c3d-4e5f-6789-abcd-ef0123456789")
        host = f"10-1-2-3.fjord-{role}-headless.fjord.svc"
        # A SASL door is advertised at --advertised-host, a name the role's certificate covers.
        assert flag(argv, "--advertised-host") == host
        assert flag(argv, "--sasl-listen") == f"0.0.0.0:{s.SASL_GRPC_PORT}"
        assert "sasl-grpc" in ports(deployment)
        if role == "coordinator":
            assert [(d.name, d.protocol, d.advertised) for d in doors_of(argv)] == [
                ("TLS", "SSL", (host, 9095)), ("SCRAM", "SASL_SSL", (host, 9096))]
            assert {"tls", "scram"} <= set(ports(deployment))
        else:
            assert "--listeners" not in argv


def test_without_spec_listeners_the_one_kafka_door_is_unchanged(tmp_path: Path) -> None:
    for security, door in (({"kafkaAuthentication": "scram-sha-512"}, "SASL_SSL"), ({}, "SSL")):
        broker = objects(secure_cluster(security=security))["StatefulSet/fjord-broker"]
        argv = run_container_command(container(broker)["command"], tmp_path,
                                     HOSTNAME="fjord-broker-0")
        assert flag(argv, "--listeners") == f"{door}://0.0.0.0:{s.KAFKA_PORT}"
        assert "--listener-security-protocol-map" not in argv and "--sasl-listen" not in argv
        assert ports(broker) == {"grpc": 9092, "kafka": 9095, "metrics": 9404}
    plain = objects(cluster(listeners=[{"name": "plain", "port": 9200}]))
    argv = run_container_command(container(plain["StatefulSet/fjord-broker"])["command"],
                                 tmp_path, HOSTNAME="fjord-broker-0")
    assert [(d.name, d.protocol) for d in doors_of(argv)] == [("PLAIN", "KAFKA")]


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"listeners": []}, "non-empty list"),
    ({"listeners": [{"name": "TLS", "port": 9095}]}, "lower-case letters"),
    ({"listeners": [{"name": "grpc", "port": 9095}]}, "is taken"),
    ({"listeners": [{"name": "kafka", "port": 9095}]}, "is taken"),
    ({"listeners": [{"name": "a", "port": 9095}, {"name": "a", "port": 9096}]}, "given twice"),
    ({"listeners": [{"name": "a", "port": 9094}]}, "the coordinators' gRPC port"),
    ({"listeners": [{"name": "a", "port": 9404}]}, "the metrics port"),
    ({"listeners": [{"name": "a", "port": 70000}]}, "1..65535"),
    ({"listeners": [{"name": "a", "port": 9095}, {"name": "b", "port": 9095}]}, "is also"),
    ({"listeners": [{"name": "a", "port": 9097}],
      "security": {"saslGrpcDoor": {"enabled": True}}}, "is also spec.security.saslGrpcDoor"),
    ({"listeners": [{"name": "a", "port": 9095, "authentication": "none"}]}, "one of tls"),
    ({"security": {"saslGrpcDoor": {"enabled": True, "port": 9092}}}, "the brokers' gRPC"),
    ({"security": {"saslGrpcDoor": "yes"}}, "must be an object"),
])
def test_listener_problems_are_named(spec: dict[str, Any], fragment: str) -> None:
    problems = builders.cluster_spec_problems(secure_cluster(**spec)["spec"])
    assert any(fragment in p for p in problems), problems


def test_plaintext_listeners_take_no_authentication_and_doors_need_tls() -> None:
    spec = cluster(listeners=[{"name": "a", "port": 9095, "authentication": "tls"}],
                   security={"saslGrpcDoor": {"enabled": True}})["spec"]
    problems = builders.cluster_spec_problems(spec)
    assert any("must be one of none without spec.security.tls" in p for p in problems)
    assert any("saslGrpcDoor needs spec.security.tls" in p for p in problems)
    assert builders.cluster_spec_problems(secure_cluster(listeners=TWO_LISTENERS)["spec"]) == []


def test_scram_is_served_by_a_scram_listener_or_the_sasl_doors() -> None:
    assert not serves_scram(secure_cluster()["spec"])
    assert serves_scram(secure_cluster(security={"kafkaAuthentication": "scram-sha-512"})["spec"])
    assert serves_scram(secure_cluster(listeners=TWO_LISTENERS)["spec"])
    doors = secure_cluster(security={"saslGrpcDoor": {"enabled": True, "port": 9300}})["spec"]
    assert serves_scram(doors) and sasl_grpc_door_port(doors) == 9300
    assert [x.name for x in kafka_listeners(doors)] == ["kafka"]


def test_a_users_client_properties_say_where_each_kind_of_client_connects() -> None:
    body = secure_cluster(listeners=TWO_LISTENERS, security={"saslGrpcDoor": {"enabled": True}})
    service = "fjord-broker.fjord.svc"
    assert client_bootstrap_hints(body, "scram-sha-512") == [
        f"Kafka clients (listener scram): bootstrap.servers={service}:9096",
        f"Fjord's clients (SASL gRPC doors): bootstrap.servers={service}:{s.SASL_GRPC_PORT}",
    ]
    assert client_bootstrap_hints(body, "tls") == [
        f"Kafka clients (listener tls): bootstrap.servers={service}:9095",
        f"Fjord's clients (gRPC): bootstrap.servers={service}:9092",
    ]
    now = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
    ca = make_ca("test CA", validity=datetime.timedelta(days=30), now=now)
    made = plan_user_credentials("bob", "scram-sha-512", ca, None, now,
                                 datetime.timedelta(days=10), datetime.timedelta(days=1),
                                 client_bootstrap_hints(body, "scram-sha-512"))
    lines = made.data[s.USER_PROPERTIES_KEY].decode().splitlines()
    assert f"# Fjord's clients (SASL gRPC doors): bootstrap.servers={service}:9097" in lines
    assert "security.protocol=SASL_SSL" in lines
    again = plan_user_credentials("bob", "scram-sha-512", ca, made.data, now,
                                  datetime.timedelta(days=10), datetime.timedelta(days=1),
                                  client_bootstrap_hints(body, "scram-sha-512"))
    assert not again.changed
