"""Renewal of the cluster CA without losing trust or availability (issue 16, Kubernetes), the
way Strimzi renews its cluster CA. Pure: no I/O and no clock (the time is passed in); the only
side effect is the randomness of a new CA key.

A CA the operator made (its Secret ``X-cluster-ca`` is owned by the FjordCluster) is renewed
once it is inside ``spec.security.clusterCa.renewalDays`` of its end, in three phases, each
derived from what the CA Secret holds (the operator may restart between any two steps):

1. ``TrustingNewCa`` (:attr:`CaPhase.TRUSTING_NEW`): a new CA is made and kept beside the old
   one (``next-ca.crt``/``next-ca.key``); the old CA still signs everything, and every role's
   and every FjordUser's ``ca.crt`` becomes the bundle old + new. The pods roll onto it.
2. ``ReissuingCertificates`` (:attr:`CaPhase.REISSUING`): once every service pod runs the
   bundle and every FjordUser Secret holds it, the new CA becomes the signing CA (``ca.crt``/
   ``ca.key``) and the old certificate moves to ``previous-ca.crt`` (its key is dropped). The
   bundle stays new + old; every service and FjordUser certificate is re-issued by the new CA
   (they no longer verify against the signing CA) and the pods roll again.
3. Once every service pod runs a certificate of the new CA and every ``tls`` FjordUser's
   certificate is of the new CA, ``previous-ca.crt`` is dropped: the bundle is the new CA alone
   and a last roll takes it to the pods (:attr:`CaPhase.STABLE` again).

Invariant (the property tests check it over every interleaving of reconciliations, pod
restarts, user reconciliations and operator restarts): at every moment every pair of running
services, the operator's client certificate and every FjordUser's certificate are each
trusted by every service, because no service presents a certificate of a CA before every
service trusts that CA, and no service stops trusting a CA while anything still presents a
certificate of it. A CA the user supplied (adopted, not owned by the cluster) is never
replaced: inside its renewal window :class:`CaDecision` only reports that it is expiring.
"""

from __future__ import annotations

import datetime
import enum
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from fjord.security.certificates import CertificateAuthority, make_ca
from fjord_operator import settings as s

SecretData = Mapping[str, bytes]

#: The CA Secret's keys that exist only during a renewal.
ROTATION_KEYS = (s.NEXT_CA_CERT_KEY, s.NEXT_CA_KEY_KEY, s.PREVIOUS_CA_CERT_KEY)


class CaPhase(enum.Enum):
    """Where a cluster CA is in its renewal (``status.clusterCa.phase``)."""

    STABLE = "Stable"
    TRUSTING_NEW = "TrustingNewCa"
    REISSUING = "ReissuingCertificates"


# -- certificates -------------------------------------------------------------------------------


def load_certificate(pem: bytes | None) -> x509.Certificate | None:
    """The first certificate of ``pem``; None when there is none or it does not parse."""
    if not pem:
        return None
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None


def load_certificates(pem: bytes | None) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (empty when there is none or one does not parse)."""
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether ``issuer`` signed ``cert`` (names and signature, as a TLS peer checks)."""
    if cert.issuer != issuer.subject or not isinstance(
        issuer.public_key(), ec.EllipticCurvePublicKey
    ):
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def signed_by(cert: x509.Certificate, ca: CertificateAuthority) -> bool:
    return issued_by(cert, ca.certificate)


def trusted_by(cert: x509.Certificate, bundle: bytes) -> bool:
    """Whether a peer whose ``ca.crt`` is ``bundle`` accepts ``cert`` (one of the bundle's
    certificates issued it)."""
    return any(issued_by(cert, ca) for ca in load_certificates(bundle))


# -- the CA Secret ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterCa:
    """What the cluster CA Secret holds: the CA that signs now, and during a renewal either the
    new CA not signing yet (``next``) or the replaced CA's certificate (``previous``).
    ``managed``: the operator made it (and may renew it)."""

    signing: CertificateAuthority
    managed: bool
    next: CertificateAuthority | None = None
    previous: x509.Certificate | None = None

    @property
    def phase(self) -> CaPhase:
        if self.next is not None:
            return CaPhase.TRUSTING_NEW
        if self.previous is not None:
            return CaPhase.REISSUING
        return CaPhase.STABLE

    def trusted(self) -> list[x509.Certificate]:
        """The CA certificates every service and client trusts now (signing CA first)."""
        out = [self.signing.certificate]
        if self.next is not None:
            out.append(self.next.certificate)
        if self.previous is not None:
            out.append(self.previous)
        return out

    def bundle(self) -> bytes:
        """``ca.crt`` of every role's and FjordUser's Secret: the trusted CAs, concatenated PEM."""
        from cryptography.hazmat.primitives import serialization

        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.trusted())

    def secret_data(self) -> dict[str, bytes]:
        """The CA Secret's data (the keys of :data:`ROTATION_KEYS` it lacks are to be removed)."""
        from cryptography.hazmat.primitives import serialization

        data = {s.CA_CERT_KEY: self.signing.pem(), s.CA_KEY_KEY: self.signing.key_pem()}
        if self.next is not None:
            data[s.NEXT_CA_CERT_KEY] = self.next.pem()
            data[s.NEXT_CA_KEY_KEY] = self.next.key_pem()
        if self.previous is not None:
            data[s.PREVIOUS_CA_CERT_KEY] = self.previous.public_bytes(
                serialization.Encoding.PEM
            )
        return data


def read_cluster_ca(data: SecretData, managed: bool) -> ClusterCa:
    """The CA Secret's content. ValueError saying what is wrong when ``ca.crt``/``ca.key`` are
    not a CA's pair, or (a CA the operator manages) a renewal key is unusable or both renewal
    phases' keys are present. A user-supplied CA's renewal keys are ignored: it is never
    renewed by the operator."""
    signing = CertificateAuthority.from_pem(
        data.get(s.CA_CERT_KEY, b""), data.get(s.CA_KEY_KEY, b"")
    )
    if not managed:
        return ClusterCa(signing, managed=False)
    next_ca: CertificateAuthority | None = None
    previous: x509.Certificate | None = None
    if s.NEXT_CA_CERT_KEY in data or s.NEXT_CA_KEY_KEY in data:
        try:
            next_ca = CertificateAuthority.from_pem(
                data.get(s.NEXT_CA_CERT_KEY, b""), data.get(s.NEXT_CA_KEY_KEY, b"")
            )
        except ValueError as exc:
            raise ValueError(f"{s.NEXT_CA_CERT_KEY}/{s.NEXT_CA_KEY_KEY}: {exc}") from None
    if s.PREVIOUS_CA_CERT_KEY in data:
        previous = load_certificate(data[s.PREVIOUS_CA_CERT_KEY])
        if previous is None:
            raise ValueError(f"{s.PREVIOUS_CA_CERT_KEY} holds no PEM certificate")
    if next_ca is not None and previous is not None:
        raise ValueError(
            f"both {s.NEXT_CA_CERT_KEY} and {s.PREVIOUS_CA_CERT_KEY} are present: a renewal is "
            "in one phase at a time"
        )
    return ClusterCa(signing, True, next_ca, previous)


def new_ca(namespace: str, cluster: str, now: datetime.datetime,
           validity: datetime.timedelta) -> CertificateAuthority:
    """A new cluster CA. Its subject names the day it was made and a random tag, so it never
    equals its predecessor's while both are trusted (verifiers look issuers up by name)."""
    tag = f"{now:%Y-%m-%d} {secrets.token_hex(3)}"
    return make_ca(f"fjord cluster CA {namespace}/{cluster} {tag}", validity=validity, now=now)


# -- what the pods and users run ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RotationObservation:
    """What a renewal waits for, as observed. ``outdated_pods``: service pods not (all) on
    their role's current TLS revision, None when the pods were not observed (then no phase
    advances). ``users_untrusting``: FjordUser Secrets whose ``ca.crt`` is not the current
    bundle. ``users_unissued``: FjordUser Secrets whose certificate the signing CA did not
    issue."""

    outdated_pods: tuple[str, ...] | None
    users_untrusting: tuple[str, ...] = ()
    users_unissued: tuple[str, ...] = ()


def observe_rotation(
    ca: ClusterCa,
    revisions: Mapping[str, str],
    pods: Mapping[str, Mapping[str, str | None]] | None,
    users: Mapping[str, SecretData],
) -> RotationObservation:
    """``pods``: per role, each live pod's TLS revision annotation (pods being deleted
    included: they still run); ``users``: each FjordUser Secret's data by name."""
    outdated: tuple[str, ...] | None = None
    if pods is not None:
        outdated = tuple(sorted(
            name for role, by_name in pods.items() for name, revision in by_name.items()
            if revision != revisions.get(role)
        ))
    bundle = ca.bundle()
    untrusting = tuple(sorted(n for n, d in users.items() if d.get(s.CA_CERT_KEY) != bundle))
    unissued = []
    for name, data in sorted(users.items()):
        if s.USER_CERT_KEY in data:
            cert = load_certificate(data[s.USER_CERT_KEY])
            if cert is None or not signed_by(cert, ca.signing):
                unissued.append(name)
    return RotationObservation(outdated, untrusting, tuple(unissued))


# -- the decision -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaDecision:
    """The CA Secret after this reconciliation (``changed``: it must be written), a message
    for ``status.clusterCa`` and whether a CA the operator may not renew is expiring."""

    ca: ClusterCa
    changed: bool
    message: str
    expiring: bool = False


def _names(items: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def renewal_due(ca: ClusterCa, now: datetime.datetime,
                renew_before: datetime.timedelta) -> bool:
    return ca.signing.certificate.not_valid_after_utc - renew_before <= now


def decide_cluster_ca(
    ca: ClusterCa,
    observed: RotationObservation,
    now: datetime.datetime,
    *,
    renew_before: datetime.timedelta,
    validity: datetime.timedelta,
    namespace: str,
    cluster: str,
) -> CaDecision:
    """The next step of the cluster CA (at most one phase per call; see the module)."""
    end = ca.signing.certificate.not_valid_after_utc.isoformat()
    if ca.phase is CaPhase.STABLE:
        if not renewal_due(ca, now, renew_before):
            return CaDecision(ca, False, f"the cluster CA is valid until {end}")
        if not ca.managed:
            return CaDecision(
                ca, False,
                f"the cluster CA expires at {end} and was supplied, not made by the operator: "
                "it is never replaced automatically; renew it in Secret "
                f"{cluster}-cluster-ca before then",
                expiring=True,
            )
        made = new_ca(namespace, cluster, now, validity)
        return CaDecision(
            replace(ca, next=made), True,
            f"the cluster CA expires at {end}: a new CA is made and trusted beside it",
        )
    if observed.outdated_pods is None:
        return CaDecision(ca, False, f"{ca.phase.value}: waiting to observe the pods")
    if observed.outdated_pods:
        return CaDecision(
            ca, False,
            f"{ca.phase.value}: waiting for pods to restart on the current certificates: "
            f"{_names(observed.outdated_pods)}",
        )
    if ca.phase is CaPhase.TRUSTING_NEW:
        if observed.users_untrusting:
            return CaDecision(
                ca, False,
                "TrustingNewCa: waiting for FjordUser Secrets to trust the new CA: "
                f"{_names(observed.users_untrusting)}",
            )
        assert ca.next is not None
        swapped = ClusterCa(ca.next, True, previous=ca.signing.certificate)
        return CaDecision(
            swapped, True,
            "every service trusts the new CA: it signs from now on; every certificate is "
            "re-issued by it",
        )
    if observed.users_unissued or observed.users_untrusting:
        waiting = tuple(sorted({*observed.users_unissued, *observed.users_untrusting}))
        return CaDecision(
            ca, False,
            "ReissuingCertificates: waiting for FjordUser certificates of the new CA: "
            f"{_names(waiting)}",
        )
    return CaDecision(
        ClusterCa(ca.signing, True), True,
        "nothing is signed by the previous CA any more: it is no longer trusted",
    )


def ca_status(decision: CaDecision) -> dict[str, object]:
    """``status.clusterCa`` of a FjordCluster."""
    ca = decision.ca
    return {
        "phase": ca.phase.value,
        "managed": ca.managed,
        "notAfter": ca.signing.certificate.not_valid_after_utc.isoformat(),
        "expiring": decision.expiring,
        "message": decision.message,
    }
