"""Pure security decisions of the operator (issue 16, Kubernetes): the cluster CA and the
services' certificates kept in Secrets, their renewal, and the credentials and ACLs of a
``FjordUser``. No I/O and no clock: the time is passed in; the only side effect is the
randomness of new keys, salts and passwords.

Secrets (for a FjordCluster ``X``; data keys in :mod:`fjord_operator.settings`):

- ``X-cluster-ca``: ``ca.crt``, ``ca.key`` (the CA that signs). Made once (or supplied by the
  user before the cluster: an existing one is adopted, never replaced). One the operator made
  is renewed inside ``spec.security.clusterCa.renewalDays`` of its end, in phases kept in the
  same Secret (``next-ca.*``, then ``previous-ca.crt``; :mod:`fjord_operator.ca_rotation`).
- ``X-broker-tls``, ``X-controller-tls``, ``X-coordinator-tls``: ``ca.crt`` (the trust bundle:
  every CA trusted now, several during a CA renewal), ``service.pem``
  (certificate and key, Kafka's PEM keystore) and ``security.properties`` (the services'
  ``--security-config``, paths under :data:`~fjord_operator.settings.TLS_MOUNT_DIR`). One
  certificate per role, ``CN=X-<role>, OU=fjord-service`` (the cluster service identity), with
  SANs for the role's Service names and, by wildcard, every pod's name under its headless
  Service (brokers: ``X-broker-N.X-broker-headless.NS.svc``; controllers and coordinators:
  ``<pod-ip-dashed>.X-<role>-headless.NS.svc``, the name they advertise when TLS is on).
- ``X-etcd-tls`` (a managed etcd, ``spec.etcd.managed``): ``ca.crt`` (the same trust bundle)
  and ``service.pem``, etcd's server, peer and client certificate (``CN=X-etcd``, no service
  identity) with SANs for the Service ``X-etcd`` and, by wildcard, every member under it.
- a FjordUser ``U``'s Secret ``U``: ``ca.crt`` and, for ``tls``, ``user.crt``/``user.key``
  (``CN=U``, principal ``User:U``), for ``scram-sha-512`` a generated ``password``; and a
  ``client.properties`` in Kafka's client names, as ``fjord local up --secure`` writes.

Invariants: a certificate is (re)issued only when it is missing, unreadable, not signed by the
cluster CA, names other SANs or subject than wanted, or expires within the renew-before window
(and a new one would end later: a certificate already ending with its CA waits for the CA's
renewal);
every other reconciliation keeps the Secret's bytes, so applying the plan twice changes nothing.
A role's :func:`tls_revision` changes exactly when its Secret's content changes, which is what
tells the pods that must restart.
"""

from __future__ import annotations

import datetime
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from fjord.errors import ConfigError
from fjord.security import SERVICE_IDENTITY_OU, Principal
from fjord.security.acls import (
    AUTHORIZER_CLASS_NAMES,
    CLUSTER_RESOURCE_NAME,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from fjord.security.certificates import CertificateAuthority
from fjord.security.scram import SCRAM_SHA_512
from fjord_operator import settings as s
from fjord_operator.ca_rotation import (
    ROTATION_KEYS,
    CaDecision,
    ClusterCa,
    decide_cluster_ca,
    load_certificate,
    new_ca,
    observe_rotation,
    read_cluster_ca,
    signed_by,
)

Obj = dict[str, Any]
SecretData = Mapping[str, bytes]

SERVICE_ROLES = ("broker", "controller", "coordinator")
#: The TLS Secret role of a managed etcd (``X-etcd-tls``): planned, renewed and carried
#: through a CA renewal like the services' Secrets, but its certificate carries no service
#: identity (``CN=X-etcd``, no OU): an etcd member can never pass for a broker.
ETCD_ROLE = "etcd"
#: Kafka's name of the ACL authorizer the services are given when authorization is on.
AUTHORIZER_CLASS = AUTHORIZER_CLASS_NAMES[0]
TLS, SCRAM = "tls", "scram-sha-512"
AUTHENTICATION_TYPES = (TLS, SCRAM)


class SecuritySpecError(ConfigError):
    """A security field of a FjordCluster or FjordUser that cannot be reconciled (names it)."""


# -- the FjordCluster's spec.security -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterSecurity:
    """``spec.security`` of a FjordCluster with TLS on. ``kafka_authentication``: how the
    Kafka-protocol door authenticates clients (``tls``: an ``SSL://`` door with client
    certificates; ``scram-sha-512``: a ``SASL_SSL://`` door with SCRAM logins)."""

    authorization: bool
    kafka_authentication: str
    super_users: tuple[str, ...]
    validity: datetime.timedelta
    renew_before: datetime.timedelta
    ca_validity: datetime.timedelta = datetime.timedelta(days=s.CA_VALIDITY_DAYS)
    ca_renew_before: datetime.timedelta = datetime.timedelta(days=s.DEFAULT_CA_RENEWAL_DAYS)


def cluster_security(spec: Mapping[str, Any]) -> ClusterSecurity | None:
    """The cluster's security settings, None when TLS is off (plaintext). Raises
    SecuritySpecError naming the field (see :func:`cluster_security_problems`)."""
    problems = cluster_security_problems(spec)
    if problems:
        raise SecuritySpecError("; ".join(problems))
    security = spec.get("security") or {}
    if not security.get("tls"):
        return None
    certs = security.get("certificates") or {}
    cluster_ca = security.get("clusterCa") or {}
    return ClusterSecurity(
        authorization=bool(security.get("authorization")),
        kafka_authentication=str(security.get("kafkaAuthentication", TLS)),
        super_users=tuple(str(u) for u in security.get("superUsers") or ()),
        validity=datetime.timedelta(
            days=int(certs.get("validityDays", s.DEFAULT_CERT_VALIDITY_DAYS))
        ),
        renew_before=datetime.timedelta(
            days=int(certs.get("renewalDays", s.DEFAULT_CERT_RENEWAL_DAYS))
        ),
        ca_validity=datetime.timedelta(
            days=int(cluster_ca.get("validityDays", s.CA_VALIDITY_DAYS))
        ),
        ca_renew_before=datetime.timedelta(
            days=int(cluster_ca.get("renewalDays", s.DEFAULT_CA_RENEWAL_DAYS))
        ),
    )


def cluster_security_problems(spec: Mapping[str, Any]) -> list[str]:
    """Why ``spec.security`` cannot be reconciled (empty: it can)."""
    security = spec.get("security") or {}
    if not isinstance(security, Mapping):
        return [f"spec.security must be an object, got {security!r}"]
    problems: list[str] = []
    tls = security.get("tls", False)
    if not isinstance(tls, bool):
        problems.append(f"spec.security.tls must be true or false, got {tls!r}")
    if security.get("authorization") and not tls:
        problems.append(
            "spec.security.authorization needs spec.security.tls: principals come from client "
            "certificates"
        )
    kafka = security.get("kafkaAuthentication", TLS)
    if kafka not in AUTHENTICATION_TYPES:
        problems.append(
            f"spec.security.kafkaAuthentication must be one of {', '.join(AUTHENTICATION_TYPES)},"
            f" got {kafka!r}"
        )
    for user in security.get("superUsers") or ():
        try:
            Principal.parse(str(user))
        except ConfigError as exc:
            problems.append(f"spec.security.superUsers: {exc}")
    for field, defaults in (
        ("certificates", (s.DEFAULT_CERT_VALIDITY_DAYS, s.DEFAULT_CERT_RENEWAL_DAYS)),
        ("clusterCa", (s.CA_VALIDITY_DAYS, s.DEFAULT_CA_RENEWAL_DAYS)),
    ):
        days = security.get(field) or {}
        if not isinstance(days, Mapping):
            problems.append(f"spec.security.{field} must be an object, got {days!r}")
            continue
        validity = days.get("validityDays", defaults[0])
        renewal = days.get("renewalDays", defaults[1])
        if not isinstance(validity, int) or isinstance(validity, bool) or validity < 1:
            problems.append(
                f"spec.security.{field}.validityDays must be an integer >= 1, got {validity!r}"
            )
        elif (not isinstance(renewal, int) or isinstance(renewal, bool)
              or not 0 <= renewal < validity):
            problems.append(
                f"spec.security.{field}.renewalDays must be an integer >= 0 and below "
                f"validityDays ({validity}), got {renewal!r}"
            )
    return problems


# -- names ----------------------------------------------------------------------------------------


def ca_secret_name(cluster: str) -> str:
    return f"{cluster}-cluster-ca"


def service_secret_name(cluster: str, role: str) -> str:
    return f"{cluster}-{role}-tls"


def headless_service_name(cluster: str, role: str) -> str:
    return f"{cluster}-{role}-headless"


def service_common_name(cluster: str, role: str) -> str:
    return f"{cluster}-{role}"


def service_sans(cluster: str, namespace: str, role: str) -> list[str]:
    """Every name a ``role`` pod of ``cluster`` is dialled by: its Service (short and full
    forms), every pod under its headless Service (a wildcard: brokers' ordinals, controllers'
    and coordinators' dashed pod IPs), and loopback for probes and local tools."""
    names: list[str] = []
    for service in (f"{cluster}-{role}", headless_service_name(cluster, role)):
        names += [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
        names.append(f"{service}.{namespace}.svc.cluster.local")
    headless = headless_service_name(cluster, role)
    names += [f"*.{headless}.{namespace}.svc", f"*.{headless}.{namespace}.svc.cluster.local"]
    return [*names, "localhost", "127.0.0.1"]


def managed_etcd_tls(spec: Mapping[str, Any]) -> bool:
    """Whether the managed etcd serves https: ``spec.etcd.managed.tls``, by default
    ``spec.security.tls`` (False without a managed etcd)."""
    etcd = spec.get("etcd")
    managed = etcd.get("managed") if isinstance(etcd, Mapping) else None
    if not isinstance(managed, Mapping):
        return False
    security = spec.get("security")
    secure = isinstance(security, Mapping) and security.get("tls") is True
    return secure and managed.get("tls", True) is not False


def tls_roles(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Every role with a TLS Secret in a secure cluster: the services, and the managed etcd
    when it serves https (:func:`managed_etcd_tls`)."""
    return (*SERVICE_ROLES, ETCD_ROLE) if managed_etcd_tls(spec) else SERVICE_ROLES


def etcd_sans(cluster: str, namespace: str) -> list[str]:
    """Every name a managed etcd member is dialled by: its (headless) Service ``X-etcd``, short
    and full forms (clients; a forward lookup of it also finds every member's IP, which
    etcd's peer check accepts), every member under it by wildcard (``X-etcd-N.X-etcd.NS.svc``,
    the peer and advertised client URLs) and loopback, which is also
    :data:`~fjord_operator.settings.ETCD_CLIENT_CERT_HOSTNAME` (it dials itself as a client)."""
    etcd = f"{cluster}-etcd"
    names = [etcd, f"{etcd}.{namespace}", f"{etcd}.{namespace}.svc",
             f"{etcd}.{namespace}.svc.cluster.local",
             f"*.{etcd}.{namespace}.svc", f"*.{etcd}.{namespace}.svc.cluster.local"]
    return [*names, "localhost", "127.0.0.1"]


def role_subject(cluster: str, namespace: str, role: str) -> tuple[str, str | None, list[str]]:
    """(common name, organizational unit, SANs) of a role's certificate: the services carry the
    cluster service identity (OU ``fjord-service``), a managed etcd does not."""
    if role == ETCD_ROLE:
        return f"{cluster}-etcd", None, etcd_sans(cluster, namespace)
    return (service_common_name(cluster, role), SERVICE_IDENTITY_OU,
            service_sans(cluster, namespace, role))


# -- certificates -------------------------------------------------------------------------------


def certificate_sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in ext.get_values_for_type(x509.DNSName)] + [
        str(v) for v in ext.get_values_for_type(x509.IPAddress)
    ]


def renewal_due(
    cert: x509.Certificate | None,
    ca: CertificateAuthority,
    *,
    common_name: str,
    organizational_unit: str | None,
    sans: Sequence[str],
    now: datetime.datetime,
    renew_before: datetime.timedelta,
) -> str | None:
    """Why ``cert`` must be (re)issued, or None when it may be kept: missing or unreadable,
    not signed by ``ca``, another subject or SAN list, or expiring within ``renew_before``
    unless it already ends with ``ca`` (a new one could not end later: re-issuing it on every
    reconciliation would restart the pods for nothing; the CA's renewal replaces it)."""
    if cert is None:
        return "missing"
    if not signed_by(cert, ca):
        return "not signed by the cluster CA"
    subject = cert.subject
    cn = [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    ou = [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    if cn != [common_name] or ou != ([organizational_unit] if organizational_unit else []):
        return "another subject"
    if sorted(certificate_sans(cert)) != sorted(sans):
        return "other names (SANs)"
    end = cert.not_valid_after_utc
    if end - renew_before <= now and end < ca.certificate.not_valid_after_utc:
        return f"expires at {end.isoformat()}"
    return None


def issue(
    ca: CertificateAuthority,
    common_name: str,
    *,
    organizational_unit: str | None,
    sans: Sequence[str],
    now: datetime.datetime,
    validity: datetime.timedelta,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) valid from a few minutes before ``now`` for ``validity``
    (capped at the CA's own end: a leaf never outlives its issuer). SecuritySpecError when the
    CA has expired."""
    not_after = min(now + validity, ca.certificate.not_valid_after_utc)
    if not_after <= now:
        raise SecuritySpecError(
            f"the cluster CA {ca.certificate.subject.rfc4514_string()} expired at "
            f"{ca.certificate.not_valid_after_utc.isoformat()}: no certificate can be issued "
            "with it (replace the CA Secret; every pod and client must trust the new CA)"
        )
    return ca.issue(
        common_name,
        organizational_unit=organizational_unit,
        sans=sans,
        not_before=now - datetime.timedelta(minutes=5),
        not_after=not_after,
    )


def tls_revision(data: SecretData) -> str:
    """A digest of a Secret's content: changes exactly when the content does."""
    digest = hashlib.sha256()
    for key in sorted(data):
        digest.update(key.encode() + b"\0" + data[key] + b"\0")
    return digest.hexdigest()[:16]


def service_properties(security: ClusterSecurity) -> bytes:
    """The ``--security-config`` of every service pod (paths in the mounted Secret)."""
    lines = [
        f"ssl.keystore.location={s.TLS_MOUNT_DIR}/{s.SERVICE_KEYSTORE_KEY}",
        f"ssl.truststore.location={s.TLS_MOUNT_DIR}/{s.CA_CERT_KEY}",
        "ssl.client.auth=required",
    ]
    if security.authorization:
        lines.append(f"authorizer.class.name={AUTHORIZER_CLASS}")
        if security.super_users:
            lines.append(f"super.users={';'.join(security.super_users)}")
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True, slots=True)
class CertificatePlan:
    """One reconciliation of a secure cluster's Secrets: the CA to sign with (``cluster_ca``:
    the whole CA Secret, ``trust``: the bundle every ``ca.crt`` holds), the Secrets to write
    (only those whose content changes, the CA Secret first), each role's :func:`tls_revision`
    after the plan, why each rewritten role changed (``renewed``: the pods of these roles must
    restart once the Secret is written, unless they are new) and the CA's renewal step
    (``ca_decision``, for ``status.clusterCa``)."""

    ca: CertificateAuthority
    secrets: list[Obj]
    revisions: dict[str, str]
    renewed: dict[str, str]
    cluster_ca: ClusterCa
    ca_decision: CaDecision

    @property
    def trust(self) -> bytes:
        return self.cluster_ca.bundle()


def plan_certificates(
    body: Mapping[str, Any],
    security: ClusterSecurity,
    ca_data: SecretData | None,
    service_data: Mapping[str, SecretData | None],
    now: datetime.datetime,
    *,
    ca_managed: bool = False,
    pods: Mapping[str, Mapping[str, str | None]] | None = None,
    users: Mapping[str, SecretData] | None = None,
) -> CertificatePlan:
    """What the cluster's Secrets must hold now. ``ca_data``/``service_data``: the live
    Secrets' decoded data (None: missing). ``ca_managed``: the operator made the CA Secret
    (owns it), so it may renew it. ``pods`` (per role, each live pod's TLS revision) and
    ``users`` (each FjordUser Secret of the cluster): what a CA renewal waits for (see
    :mod:`fjord_operator.ca_rotation`; ``pods`` None: not observed, no phase advances). An
    unusable CA Secret raises SecuritySpecError (the operator never overwrites a CA: every
    certificate and client trusts it)."""
    meta = body["metadata"]
    cluster, namespace = meta["name"], meta.get("namespace", "default")
    out: list[Obj] = []
    if ca_data is None:
        ca = ClusterCa(
            new_ca(namespace, cluster, now - datetime.timedelta(minutes=5),
                   security.ca_validity),
            managed=True,
        )
        out.append(_ca_secret(body, ca, {}))
    else:
        try:
            ca = read_cluster_ca(ca_data, ca_managed)
        except ValueError as exc:
            raise SecuritySpecError(
                f"Secret {ca_secret_name(cluster)}: {exc} (it needs {s.CA_CERT_KEY} and "
                f"{s.CA_KEY_KEY}, PEM, an EC key)"
            ) from None
    services, revisions, renewed = _plan_services(body, security, ca, service_data, now)
    decision = decide_cluster_ca(
        ca, observe_rotation(ca, revisions, pods, users or {}), now,
        renew_before=security.ca_renew_before, validity=security.ca_validity,
        namespace=namespace, cluster=cluster,
    )
    if decision.changed:
        ca = decision.ca
        out.append(_ca_secret(body, ca, ca_data or {}))
        services, revisions, renewed = _plan_services(body, security, ca, service_data, now)
    return CertificatePlan(ca.signing, out + services, revisions, renewed, ca, decision)


def _ca_secret(body: Mapping[str, Any], ca: ClusterCa, live: SecretData) -> Obj:
    """The CA Secret of ``ca``; renewal keys the ``live`` one has and ``ca`` no longer has are
    removed (null in the merge patch)."""
    obj = secret(body, ca_secret_name(body["metadata"]["name"]), "ca", ca.secret_data())
    for key in ROTATION_KEYS:
        if key in live:
            obj["data"].setdefault(key, None)
    return obj


def _plan_services(
    body: Mapping[str, Any],
    security: ClusterSecurity,
    ca: ClusterCa,
    service_data: Mapping[str, SecretData | None],
    now: datetime.datetime,
) -> tuple[list[Obj], dict[str, str], dict[str, str]]:
    """Each role's Secret under ``ca``: (Secrets to write, revisions, why each changed)."""
    meta = body["metadata"]
    cluster, namespace = meta["name"], meta.get("namespace", "default")
    properties = service_properties(security)
    trust = ca.bundle()
    out: list[Obj] = []
    revisions: dict[str, str] = {}
    renewed: dict[str, str] = {}
    for role in tls_roles(body.get("spec") or {}):
        live = service_data.get(role)
        common_name, unit, sans = role_subject(cluster, namespace, role)
        keystore = (live or {}).get(s.SERVICE_KEYSTORE_KEY)
        why = renewal_due(
            load_certificate(keystore), ca.signing, common_name=common_name,
            organizational_unit=unit, sans=sans, now=now,
            renew_before=security.renew_before,
        )
        if why is not None or keystore is None:
            cert, key = issue(
                ca.signing, common_name, organizational_unit=unit, sans=sans,
                now=now, validity=security.validity,
            )
            keystore = cert + key
        data = {s.CA_CERT_KEY: trust, s.SERVICE_KEYSTORE_KEY: keystore}
        if role != ETCD_ROLE:  # etcd takes its files as flags
            data[s.SERVICE_PROPERTIES_KEY] = properties
        revisions[role] = tls_revision(data)
        if live is None or dict(live) != data:
            if live is not None:
                if why is None and live.get(s.CA_CERT_KEY) != trust:
                    why = f"trusted CAs changed (cluster CA {ca.phase.value})"
                renewed[role] = why or "security settings changed"
            out.append(secret(body, service_secret_name(cluster, role), role, data,
                              {s.TLS_REVISION_ANNOTATION: revisions[role]}))
    return out, revisions, renewed


def secret(
    owner: Mapping[str, Any],
    name: str,
    component: str,
    data: SecretData,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A Secret owned by ``owner`` (a FjordCluster or FjordUser), data base64-encoded."""
    import base64

    from fjord_operator.builders import labels, owner_reference

    meta = owner["metadata"]
    cluster = str((owner.get("spec") or {}).get("cluster") or meta["name"])
    metadata: Obj = {
        "name": name,
        "namespace": meta.get("namespace", "default"),
        "labels": labels(cluster, component),
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def decode_secret(obj: Mapping[str, Any] | None) -> dict[str, bytes] | None:
    """A live Secret's data, decoded (None for a missing Secret)."""
    import base64

    if obj is None:
        return None
    return {
        k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items() if v is not None
    }


def operator_identity(
    ca: CertificateAuthority, now: datetime.datetime
) -> tuple[bytes, bytes]:
    """The operator's own client certificate for one cluster (see settings)."""
    return issue(
        ca, s.OPERATOR_COMMON_NAME, organizational_unit=SERVICE_IDENTITY_OU, sans=(), now=now,
        validity=datetime.timedelta(hours=s.OPERATOR_CERT_VALIDITY_HOURS),
    )


# -- FjordUser ----------------------------------------------------------------------------------

#: Strimzi's resource type names -> Kafka's.
_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "cluster": ResourceType.CLUSTER,
    "transactionalid": ResourceType.TRANSACTIONAL_ID,
}
_PATTERN_TYPES = {"literal": PatternType.LITERAL, "prefix": PatternType.PREFIXED,
                  "prefixed": PatternType.PREFIXED}
_PERMISSIONS = {"allow": AclPermissionType.ALLOW, "deny": AclPermissionType.DENY}


def user_principal(name: str) -> str:
    return f"User:{name}"


def user_authentication(spec: Mapping[str, Any]) -> str:
    """``spec.authentication.type``; SecuritySpecError naming it when it is not tls or
    scram-sha-512."""
    kind = ((spec.get("authentication") or {}).get("type"))
    if kind not in AUTHENTICATION_TYPES:
        raise SecuritySpecError(
            f"spec.authentication.type must be one of {', '.join(AUTHENTICATION_TYPES)}, "
            f"got {kind!r}"
        )
    return str(kind)


def user_acls(name: str, spec: Mapping[str, Any]) -> frozenset[AclBinding]:
    """The ACL bindings ``spec.authorization.acls`` asks for, principal ``User:<name>``
    (Strimzi's KafkaUser fields: ``resource: {type, name, patternType}``, ``operations`` or
    ``operation``, ``host``, ``type`` allow|deny). Raises SecuritySpecError naming the entry
    and field that is wrong (the ACL model's own checks included)."""
    acls = (spec.get("authorization") or {}).get("acls") or []
    out: set[AclBinding] = set()
    for i, acl in enumerate(acls):
        where = f"spec.authorization.acls[{i}]"
        if not isinstance(acl, Mapping):
            raise SecuritySpecError(f"{where} must be an object, got {acl!r}")
        resource = acl.get("resource") or {}
        kind = str(resource.get("type", "")).replace("-", "").replace("_", "").lower()
        if kind not in _RESOURCE_TYPES:
            raise SecuritySpecError(
                f"{where}.resource.type must be topic, group, cluster or transactionalId, got "
                f"{resource.get('type')!r}"
            )
        rtype = _RESOURCE_TYPES[kind]
        pattern_name = str(resource.get("patternType", "literal")).lower()
        if pattern_name not in _PATTERN_TYPES:
            raise SecuritySpecError(
                f"{where}.resource.patternType must be literal or prefix, got "
                f"{resource.get('patternType')!r}"
            )
        resource_name = (
            CLUSTER_RESOURCE_NAME if rtype is ResourceType.CLUSTER
            else str(resource.get("name") or "")
        )
        if not resource_name:
            raise SecuritySpecError(f"{where}.resource.name is required for a {kind}")
        operations = list(acl.get("operations") or ())
        if acl.get("operation"):
            operations.append(acl["operation"])
        if not operations:
            raise SecuritySpecError(f"{where} names no operations")
        permission = str(acl.get("type", "allow")).lower()
        if permission not in _PERMISSIONS:
            raise SecuritySpecError(f"{where}.type must be allow or deny, got {acl.get('type')!r}")
        for operation in operations:
            try:
                out.add(
                    AclBinding(
                        ResourcePattern(rtype, resource_name, _PATTERN_TYPES[pattern_name]),
                        AccessControlEntry(
                            user_principal(name), str(acl.get("host", "*")),
                            AclOperation.parse(str(operation)), _PERMISSIONS[permission],
                        ),
                    )
                )
            except AclError as exc:
                raise SecuritySpecError(f"{where}: {exc}") from None
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class AclChanges:
    """What brings a user's ACLs to the spec: bindings to create and to delete."""

    create: frozenset[AclBinding]
    delete: frozenset[AclBinding]


def diff_acls(desired: frozenset[AclBinding], live: frozenset[AclBinding]) -> AclChanges:
    """Drift in both directions: what the spec has and the controller lacks is created, what
    the controller has for the principal and the spec does not is deleted."""
    return AclChanges(create=desired - live, delete=live - desired)


def user_client_properties(
    kind: str, name: str, password: str | None, mount: str, hints: Sequence[str] = ()
) -> bytes:
    """A FjordUser's ``client.properties`` (Kafka's client names; paths under ``mount``;
    ``hints``: comment lines, where to connect)."""
    lines = [f"# FjordUser {name}: mount this Secret at {mount} (the paths below point there)"]
    lines += [f"# {hint}" for hint in hints]
    if kind == TLS:
        lines += [
            "security.protocol=SSL",
            f"ssl.ca.location={mount}/{s.CA_CERT_KEY}",
            f"ssl.certificate.location={mount}/{s.USER_CERT_KEY}",
            f"ssl.key.location={mount}/{s.USER_KEY_KEY}",
        ]
    else:
        lines += [
            "security.protocol=SASL_SSL",
            f"ssl.ca.location={mount}/{s.CA_CERT_KEY}",
            f"sasl.mechanism={SCRAM_SHA_512}",
            f"sasl.username={name}",
            f"sasl.password={password}",
        ]
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True, slots=True)
class UserCredentials:
    """A FjordUser's Secret data after this reconciliation and whether it changed; for
    ``scram-sha-512`` the password whose credential the controller must hold."""

    data: dict[str, bytes]
    changed: bool
    password: str | None


def plan_user_credentials(
    name: str,
    kind: str,
    ca: CertificateAuthority,
    live: SecretData | None,
    now: datetime.datetime,
    validity: datetime.timedelta,
    renew_before: datetime.timedelta,
    hints: Sequence[str] = (),
    *,
    trust: bytes | None = None,
) -> UserCredentials:
    """Keep what the live Secret holds when it is still right (same CA, a certificate not due
    for renewal, or a password), else make it anew. A new password is random
    (:data:`~fjord_operator.settings.SCRAM_PASSWORD_BYTES`). ``hints``: where to connect
    (comments of ``client.properties``, fjord_operator.listeners.client_bootstrap_hints).
    ``trust``: the ``ca.crt`` bundle (default: ``ca`` alone; during a CA renewal both CAs, see
    :class:`~fjord_operator.ca_rotation.ClusterCa`)."""
    live = dict(live or {})
    data: dict[str, bytes] = {s.CA_CERT_KEY: trust if trust is not None else ca.pem()}
    password: str | None = None
    if kind == TLS:
        cert_pem = live.get(s.USER_CERT_KEY)
        key_pem = live.get(s.USER_KEY_KEY)
        why = renewal_due(
            load_certificate(cert_pem), ca, common_name=name, organizational_unit=None,
            sans=(), now=now, renew_before=renew_before,
        )
        if why is not None or not key_pem or cert_pem is None:
            cert_pem, key_pem = issue(
                ca, name, organizational_unit=None, sans=(), now=now, validity=validity
            )
        data[s.USER_CERT_KEY] = cert_pem
        data[s.USER_KEY_KEY] = key_pem
    else:
        stored = live.get(s.USER_PASSWORD_KEY)
        password = stored.decode() if stored else secrets.token_urlsafe(s.SCRAM_PASSWORD_BYTES)
        data[s.USER_PASSWORD_KEY] = password.encode()
    data[s.USER_PROPERTIES_KEY] = user_client_properties(
        kind, name, password, s.USER_SECRET_MOUNT_DIR, hints
    )
    return UserCredentials(data, data != live, password)


def exact_filter(binding: AclBinding) -> AclBindingFilter:
    """The filter that selects exactly ``binding`` (DeleteAcls of one binding)."""
    return AclBindingFilter(
        resource_type=binding.pattern.resource_type,
        name=binding.pattern.name,
        pattern_type=binding.pattern.pattern_type,
        principal=binding.entry.principal,
        host=binding.entry.host,
        operation=binding.entry.operation,
        permission=binding.entry.permission,
    )
