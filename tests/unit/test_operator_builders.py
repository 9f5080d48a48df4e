"""The operator's pure builders: a FjordCluster -> Kubernetes objects (names, labels, owner
references, ids, storage, etcd), and the checks the CRD schema cannot express."""

from __future__ import annotations

import copy
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fjord_operator import builders
from fjord_operator import settings as s
from tests.helpers.operator_specs import cluster, flag, run_container_command


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_cluster_objects_have_the_shared_names() -> None:
    objects = by_kind_name(builders.cluster_objects(cluster(), 3))
    assert set(objects) == {
        ("ConfigMap", "fjord-config"),
        ("Service", "fjord-broker-headless"),
        ("Service", "fjord-broker"),
        ("StatefulSet", "fjord-broker"),
        ("Service", "fjord-controller"),
        ("Deployment", "fjord-controller"),
        ("Service", "fjord-coordinator-headless"),
        ("Deployment", "fjord-coordinator"),
        ("PodDisruptionBudget", "fjord-broker"),
        ("PodDisruptionBudget", "fjord-controller"),
    }


def test_every_object_is_labelled_owned_and_namespaced() -> None:
    for obj in builders.cluster_objects(cluster(etcd={"managed": {"replicas": 3}}), 3):
        meta = obj["metadata"]
        assert meta["namespace"] == "fjord"
        assert meta["labels"]["app.kubernetes.io/name"] == "fjord"
        assert meta["labels"]["app.kubernetes.io/instance"] == "fjord"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "fjord-operator"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "fjord.io/v1alpha1",
            "kind": "FjordCluster",
            "name": "fjord",
            "uid": "1234-abcd",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_builders_are_deterministic_and_do_not_touch_their_input() -> None:
    body = cluster(brokers={"replicas": 3, "config": {"retention.ms": "1000"}})
    before = copy.deepcopy(body)
    assert builders.cluster_objects(body, 3) == builders.cluster_objects(body, 3)
    assert body == before


def test_broker_statefulset_identity_storage_and_ports() -> None:
    body = cluster(brokers={"replicas": 5, "storage": {"size": "20Gi", "storageClassName": "fast"}})
    sts = builders.broker_statefulset(body, 4)
    spec = sts["spec"]
    assert spec["replicas"] == 4  # the scaling decision's count, not the spec's
    assert spec["serviceName"] == "fjord-broker-headless"
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "broker"
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "fjord/fjord:0.1.0"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc": 9092,
        "kafka": 9095,
        "metrics": 9404,
    }
    assert container["volumeMounts"] == [{"name": "data", "mountPath": s.BROKER_DATA_DIR}]
    script = container["command"][2]
    # The broker id is the pod ordinal (fjord-broker-3 -> 3), advertised by its stable DNS name.
    assert '--id "${HOSTNAME##*-}"' in script
    assert "$HOSTNAME.fjord-broker-headless.fjord.svc" in script
    assert script.startswith("exec fjord broker ")


def test_broker_config_becomes_flags_and_shell_words_stay_intact() -> None:
    body = cluster(
        brokers={"replicas": 3, "config": {"retention.ms": "1000", "min.insync.replicas": "2"}}
    )
    command = builders.broker_statefulset(body, 3)["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert command[:2] == ["sh", "-c"]
    assert command[3] == "broker"  # $0 of the script
    assert command[4:] == ["--config", "min.insync.replicas=2", "--config", "retention.ms=1000"]
    assert shlex.split(command[2])[-1] == "$@"  # extra args reach fjord broker


def test_broker_command_in_a_real_shell(tmp_path: Path) -> None:
    body = cluster(brokers={"replicas": 3, "config": {"retention.ms": "1000"}})
    (container,) = builders.broker_statefulset(body, 3)["spec"]["template"]["spec"]["containers"]
    argv = run_container_command(container["command"], tmp_path, HOSTNAME="fjord-broker-12")
    assert argv[0] == "broker"
    assert flag(argv, "--id") == "12"
    assert flag(argv, "--advertised-host") == "fjord-broker-12.fjord-broker-headless.fjord.svc"
    assert flag(argv, "--etcd") == "http://e:2379"
    assert flag(argv, "--cluster-id") == "ns.c"
    assert flag(argv, "--config") == "retention.ms=1000"
    assert flag(argv, "--metrics-port") == "9404"
    # Kafka clients are told each broker's stable DNS name, on the Service's kafka port.
    assert flag(argv, "--listeners") == "KAFKA://0.0.0.0:9095"
    assert (
        flag(argv, "--advertised-listeners")
        == "KAFKA://fjord-broker-12.fjord-broker-headless.fjord.svc:9095"
    )


def test_deployment_ids_come_from_the_pod_uid(tmp_path: Path) -> None:
    objects = by_kind_name(builders.cluster_objects(cluster(), 3))
    for name, component in (
        ("fjord-controller", "controller"),
        ("fjord-coordinator", "coordinator"),
    ):
        (container,) = objects[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        argv = run_container_command(
            container["command"],
            tmp_path,
            POD_UID="0a1b2c3d-4e5f-6789-abcd-ef0123456789",
            POD_IP="10.0.0.7",
        )
        assert argv[0] == component
        assert flag(argv, "--id") == str(0x0A1B2C3)
        assert flag(argv, "--advertised-host") == "10.0.0.7"
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env == {"POD_UID": "metadata.uid", "POD_IP": "status.podIP"}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        if component == "coordinator":  # a Kafka node: FindCoordinator names this listener
            assert flag(argv, "--listeners") == "KAFKA://0.0.0.0:9095"
            assert flag(argv, "--advertised-listeners") == "KAFKA://10.0.0.7:9095"
            assert ports == {"grpc": 9094, "kafka": 9095, "metrics": 9404}
        else:
            assert "--listeners" not in argv
            assert ports == {"grpc": 9093, "metrics": 9404}


def test_deployments_replicas_defaults_and_resources() -> None:
    body = cluster(
        controllers={"replicas": 3, "resources": {"requests": {"cpu": "100m"}}},
    )
    objects = by_kind_name(builders.cluster_objects(body, 3))
    controller = objects[("Deployment", "fjord-controller")]
    coordinator = objects[("Deployment", "fjord-coordinator")]
    assert controller["spec"]["replicas"] == 3
    assert coordinator["spec"]["replicas"] == s.DEFAULT_COORDINATOR_REPLICAS
    (container,) = controller["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "100m"}}
    assert "exec fjord controller" in container["command"][2]
    assert "--listen 0.0.0.0:9093" in container["command"][2]
    pod = coordinator["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"][2]
    assert "exec fjord coordinator" in command
    # A crashed coordinator container restarts in its pod (same id) without waiting for its
    # old lease: its --state-dir is an emptyDir, which lives as long as the pod.
    assert f"--state-dir {s.COORDINATOR_STATE_DIR} " in command
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "state", "mountPath": s.COORDINATOR_STATE_DIR}]
    assert pod["volumes"] == [{"name": "state", "emptyDir": {}}]
    assert "--state-dir" not in controller["spec"]["template"]["spec"]["containers"][0][
        "command"][2]


def test_services_and_pdbs() -> None:
    objects = by_kind_name(builders.cluster_objects(cluster(), 3))
    client = objects[("Service", "fjord-broker")]["spec"]
    headless = objects[("Service", "fjord-broker-headless")]["spec"]
    assert "clusterIP" not in client
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    for service in (client, headless):
        assert {p["name"]: p["port"] for p in service["ports"]} == {
            "grpc": 9092,
            "kafka": 9095,
            "metrics": 9404,
        }
    controller = objects[("Service", "fjord-controller")]["spec"]
    assert {p["name"]: p["port"] for p in controller["ports"]} == {"grpc": 9093, "metrics": 9404}
    coordinator = objects[("Service", "fjord-coordinator-headless")]["spec"]
    assert {p["name"]: p["port"] for p in coordinator["ports"]} == {
        "grpc": 9094,
        "kafka": 9095,
        "metrics": 9404,
    }
    for name in ("fjord-broker", "fjord-controller"):
        pdb = objects[("PodDisruptionBudget", name)]
        assert pdb["apiVersion"] == "policy/v1"
        assert pdb["spec"]["maxUnavailable"] == 1


def test_config_map_and_addresses() -> None:
    body = cluster()
    data = builders.config_map(body)["data"]
    assert data["FJORD_CLUSTER_ID"] == "fjord.fjord"
    assert data["FJORD_ETCD"] == "http://etcd.infra.svc:2379"
    assert data["FJORD_BOOTSTRAP_SERVERS"] == "fjord-broker.fjord.svc:9092"
    assert builders.bootstrap_servers(body) == "fjord-broker.fjord.svc:9092"
    body["metadata"]["annotations"] = {s.BOOTSTRAP_ANNOTATION: " 127.0.0.1:40001 "}
    assert builders.bootstrap_servers(body) == "127.0.0.1:40001"


def test_managed_etcd_three_members() -> None:
    body = cluster(etcd={"managed": {"replicas": 3, "storage": {"size": "2Gi"}}})
    objects = by_kind_name(builders.cluster_objects(body, 3))
    sts = objects[("StatefulSet", "fjord-etcd")]
    assert objects[("Service", "fjord-etcd")]["spec"]["clusterIP"] == "None"
    assert sts["spec"]["replicas"] == 3
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    initial = next(a for a in command if a.startswith("--initial-cluster="))
    assert initial.count("=http://") == 3
    assert "fjord-etcd-2=http://fjord-etcd-2.fjord-etcd.fjord.svc:2380" in initial
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "2Gi"
    }
    assert builders.etcd_url(body) == "http://fjord-etcd.fjord.svc:2379"
    assert builders.etcd_objects(cluster()) == []


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"etcd": {}}, "exactly one of endpoints or managed"),
        (
            {"etcd": {"endpoints": ["http://a:1"], "managed": {"replicas": 1}}},
            "exactly one of endpoints or managed",
        ),
        ({"etcd": {"endpoints": ["https://etcd:2379"]}}, "an https etcd needs spec.security.tls"),
        ({"etcd": {"endpoints": ["etcd:two"]}}, "invalid port"),
        ({"etcd": {"endpoints": ["http://etcd:2379/v3"]}}, "must not have a path"),
        ({"etcd": {"managed": {"replicas": 2}}}, "must be 1 or 3"),
        ({"brokers": {"replicas": 0}}, "spec.brokers.replicas must be an integer >= 1"),
        ({"brokers": {"replicas": 3, "storage": {"size": "lots"}}}, "not a Kubernetes quantity"),
        ({"brokers": {"replicas": 3, "config": {"no.such.key": "1"}}}, "no.such.key"),
        ({"brokers": {"replicas": 3, "config": {"retention.ms": "soon"}}}, "retention.ms"),
        (
            {"brokers": {"replicas": 2, "config": {"min.insync.replicas": "3"}}},
            "min.insync.replicas=3 exceeds the 2 brokers",
        ),
        (
            {"brokers": {"replicas": 2, "config": {"default.replication.factor": "3"}}},
            "default.replication.factor=3 exceeds the 2 brokers",
        ),
        ({"brokers": {"replicas": 3, "config": {"num.partitions": "0"}}}, "num.partitions"),
        ({"coordinators": {"replicas": 0}}, "spec.coordinators.replicas"),
    ],
)
def test_spec_problems_are_named(spec: dict[str, Any], fragment: str) -> None:
    problems = builders.cluster_spec_problems(cluster(**spec)["spec"])
    assert any(fragment in p for p in problems), problems


def test_a_good_spec_has_no_problems() -> None:
    assert builders.cluster_spec_problems(cluster()["spec"]) == []
    assert builders.cluster_spec_problems(cluster(etcd={"managed": {"replicas": 1}})["spec"]) == []


def test_etcd_endpoints_are_read_as_etcd_clients_read_them() -> None:
    """A bare HOST:PORT means http (etcdctl's --endpoints, Fjord's --etcd); services get the
    first endpoint with its scheme."""
    body = cluster(etcd={"endpoints": ["etcd-0.etcd.infra.svc:2379", "http://etcd-1:2379"]})
    assert builders.cluster_spec_problems(body["spec"]) == []
    assert builders.etcd_url(body) == "http://etcd-0.etcd.infra.svc:2379"
    assert builders.config_map(body)["data"]["FJORD_ETCD"] == "http://etcd-0.etcd.infra.svc:2379"
    body = cluster(etcd={"endpoints": ["http://etcd-1:2379/"]})
    assert builders.etcd_url(body) == "http://etcd-1:2379"


def test_cluster_config_goes_to_the_processes_that_read_it(tmp_path: Path) -> None:
    """spec.brokers.config is the cluster's server.properties: topic defaults reach brokers and
    controllers, num.partitions/default.replication.factor only controllers (they create
    topics), replica.* only brokers, connections.max.reauth.ms every process (SASL doors)."""
    config = {
        "num.partitions": "12",
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "replica.lag.time.max.ms": "20000",
    }
    body = cluster(brokers={"replicas": 3, "config": config})
    assert builders.cluster_spec_problems(body["spec"]) == []
    objects = by_kind_name(builders.cluster_objects(body, 3))

    def config_flags(kind: str, name: str, **env: str) -> list[str]:
        (container,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
        argv = run_container_command(container["command"], tmp_path, **env)
        return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--config"]

    pod = {"POD_UID": "0a1b2c3d-4e5f", "POD_IP": "10.0.0.7"}
    assert config_flags("StatefulSet", "fjord-broker", HOSTNAME="fjord-broker-0") == [
        "min.insync.replicas=2",
        "replica.lag.time.max.ms=20000",
    ]
    assert config_flags("Deployment", "fjord-controller", **pod) == [
        "default.replication.factor=3",
        "min.insync.replicas=2",
        "num.partitions=12",
    ]
    assert config_flags("Deployment", "fjord-coordinator", **pod) == []

    # connections.max.reauth.ms: every process with a SASL door.
    body = cluster(brokers={"replicas": 3, "config": {**config,
                                                      "connections.max.reauth.ms": "600000"}})
    assert builders.cluster_spec_problems(body["spec"]) == []
    objects = by_kind_name(builders.cluster_objects(body, 3))
    assert "connections.max.reauth.ms=600000" in config_flags(
        "StatefulSet", "fjord-broker", HOSTNAME="fjord-broker-0")
    assert config_flags("Deployment", "fjord-coordinator", **pod) == [
        "connections.max.reauth.ms=600000"]
    assert "connections.max.reauth.ms=600000" in config_flags(
        "Deployment", "fjord-controller", **pod)


def test_broker_metrics_addresses() -> None:
    body = cluster()
    hosts = ["fjord-broker-0.fjord-broker-headless.fjord.svc", "fjord-broker-1.x"]
    assert builders.broker_metrics_addresses(body, hosts) == [
        "fjord-broker-0.fjord-broker-headless.fjord.svc:9404",
        "fjord-broker-1.x:9404",
    ]
    body["metadata"]["annotations"] = {s.BOOTSTRAP_ANNOTATION: "127.0.0.1:1"}
    assert builders.broker_metrics_addresses(body, hosts) == []  # external: records instead
    body["metadata"]["annotations"][s.BROKER_METRICS_ANNOTATION] = "127.0.0.1:5, 127.0.0.1:6"
    assert builders.broker_metrics_addresses(body, hosts) == ["127.0.0.1:5", "127.0.0.1:6"]


def test_brokers_are_rolled_by_the_operator_and_a_restart_annotation_changes_the_template() -> None:
    body = cluster()
    sts = by_kind_name(builders.cluster_objects(body, 3))[("StatefulSet", "fjord-broker")]
    # OnDelete: the StatefulSet controller restarts no broker; the operator's planner does.
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert sts["spec"]["template"]["metadata"]["annotations"] == {}
    body["metadata"]["annotations"] = {s.RESTART_ANNOTATION: "1764100000"}
    sts = by_kind_name(builders.cluster_objects(body, 3))[("StatefulSet", "fjord-broker")]
    assert sts["spec"]["template"]["metadata"]["annotations"] == {
        s.RESTART_ANNOTATION: "1764100000"
    }


def test_rack_awareness_reads_the_pod_annotation_and_spreads_brokers(tmp_path: Path) -> None:
    body = cluster(brokers={"replicas": 3, "rack": {"topologyKey": "topology.kubernetes.io/zone"}})
    pod = builders.broker_statefulset(body, 3)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "pod-info", "mountPath": s.POD_INFO_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert pod["volumes"] == [{
        "name": "pod-info",
        "downwardAPI": {
            "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        },
    }]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "topology.kubernetes.io/zone"
    # The downward API writes key="value" lines; the broker starts with --rack VALUE.
    info = tmp_path / "pod"
    info.mkdir()
    (info / "annotations").write_text(
        'fjord.io/restart="1"\nfjord.io/rack="eu-west-1b"\nother="x"\n'
    )
    argv = run_container_command(
        container["command"], tmp_path, HOSTNAME="fjord-broker-2", FJORD_POD_INFO_DIR=str(info)
    )
    assert flag(argv, "--rack") == "eu-west-1b"
    assert flag(argv, "--id") == "2"
    # Without rack awareness nothing of it is in the pod.
    plain = builders.broker_statefulset(cluster(), 3)["spec"]["template"]["spec"]
    assert "volumes" not in plain and "affinity" not in plain
    assert "--rack" not in run_container_command(
        plain["containers"][0]["command"], tmp_path, HOSTNAME="fjord-broker-0"
    )


def test_a_broker_without_its_rack_annotation_waits_then_exits_naming_why(
    tmp_path: Path,
) -> None:
    body = cluster(brokers={"replicas": 1, "rack": {"topologyKey": "topology.kubernetes.io/zone"}})
    (container,) = builders.broker_statefulset(body, 1)["spec"]["template"]["spec"]["containers"]
    # The script polls once a second; a test cannot wait RACK_WAIT_S, so it checks the bound
    # is in the script and that the annotation arriving later is picked up.
    script = container["command"][2]
    assert f'-ge {s.RACK_WAIT_S} ]' in script and "does the node have the label?" in script
    info = tmp_path / "pod"
    info.mkdir()
    fake = tmp_path / "fjord"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "FJORD_ETCD": "e", "FJORD_CLUSTER_ID": "c",
           "HOSTNAME": "fjord-broker-0", "FJORD_POD_INFO_DIR": str(info)}
    proc = subprocess.Popen(container["command"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        (info / "annotations").write_text('fjord.io/rack="zone-c"\n')
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    argv = out.splitlines()
    assert flag(argv, "--rack") == "zone-c"


def test_secure_commands_in_a_real_shell(tmp_path: Path) -> None:
    """The secure containers' commands, run by sh with a stand-in fjord that prints its argv:
    every service gets the mounted --security-config; the Kafka doors are SSL://; controllers
    and coordinators advertise their dashed pod IP under their headless Service (a name the
    role certificate's wildcard SAN covers), brokers their stable pod name."""
    from fjord_operator import settings as s
    from fjord_operator.security import service_sans

    body = cluster(security={"tls": True, "authorization": True})
    body["metadata"].update(name="fj", namespace="ns")
    objs = {f"{o['kind']}/{o['metadata']['name']}": o for o in builders.cluster_objects(
        body, 3, {"broker": "b", "controller": "c", "coordinator": "o"})}
    config = f"{s.TLS_MOUNT_DIR}/security.properties"
    (broker,) = objs["StatefulSet/fj-broker"]["spec"]["template"]["spec"]["containers"]
    argv = run_container_command(broker["command"], tmp_path, HOSTNAME="fj-broker-2")
    assert flag(argv, "--security-config") == config
    assert flag(argv, "--advertised-listeners") == "SSL://fj-broker-2.fj-broker-headless.ns.svc:9095"
    for role in ("controller", "coordinator"):
        (container,) = objs[f"Deployment/fj-{role}"]["spec"]["template"]["spec"]["containers"]
        argv = run_container_command(container["command"], tmp_path, POD_IP="10.1.2.3",
                                     POD_UID="0a1b2c3d-4e5f-6789-abcd-ef0123456789")
        host = f"10-1-2-3.fj-{role}-headless.ns.svc"
        assert flag(argv, "--advertised-host") == host
        assert flag(argv, "--security-config") == config
        names = service_sans("fj", "ns", role)
        assert f"*.{host.split('.', 1)[1]}" in names
        if role == "coordinator":
            assert flag(argv, "--advertised-listeners") == f"SSL://{host}:9095"
