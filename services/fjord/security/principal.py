"""Who is on the other end of a connection: Kafka's ``KafkaPrincipal`` (``User:<name>``).

One principal type is shared by every door (gRPC, Kafka protocol) and every later check (the
cluster-action rule here; ACLs and SCRAM users build on the same type):

- a client certificate names ``User:<subject CN>``;
- a connection without one (plaintext, or TLS without client authentication) is
  ``User:ANONYMOUS``;
- the **cluster service identity** is a certificate whose subject carries the organizational
  unit :data:`SERVICE_IDENTITY_OU`. Only certificates the cluster's trust store accepts reach
  this rule, so the mark means "issued by the cluster CA for a Fjord service" as long as the
  CA issues that OU only to brokers, controllers and coordinators (``fjord local up --secure``
  and the documented ``openssl`` recipe do). Inter-broker requests need it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass

from fjord.errors import ConfigError

#: The subject OU that marks a certificate as a Fjord service (broker, controller, coordinator).
SERVICE_IDENTITY_OU = "fjord-service"

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class Principal:
    """``User:<name>``; ``is_service`` only for the cluster's service identity.

    Invariant: ``name`` is non-empty; equality includes ``is_service`` (a client that happens to
    use a service's CN is a different principal).
    """

    name: str
    is_service: bool = False
    principal_type: str = USER_TYPE

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a principal needs a name")

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """``"User:alice"`` to a principal (how kafka-acls.sh names them); ConfigError for any
        other shape or type."""
        kind, sep, name = text.partition(":")
        if not sep or not name:
            raise ConfigError(f"principal: expected User:<name>, got {text!r}")
        if kind != USER_TYPE:
            raise ConfigError(
                f"principal: unknown principal type {kind!r} in {text!r} (known: User)"
            )
        return cls(name)


ANONYMOUS = Principal("ANONYMOUS")


def principal_from_certificate_subject(
    common_names: Iterable[str], organizational_units: Iterable[str]
) -> Principal:
    """The principal of a verified client certificate from its subject's CN and OU values.

    No CN (or an empty one): ``User:ANONYMOUS`` (never a service). More than one CN: the first,
    as Kafka's default principal builder reads the subject. ``is_service`` when any OU is
    :data:`SERVICE_IDENTITY_OU`.
    """
    cn = next((name for name in common_names if name), "")
    if not cn:
        return ANONYMOUS
    return Principal(cn, is_service=SERVICE_IDENTITY_OU in set(organizational_units))


#: The principal of the SASL session whose call is being served (set by the SASL door around
#: each handler, None elsewhere): what :func:`fjord.tls.grpc_peer_principal` answers there.
#: Defined here rather than in fjord.security.sasl_sessions so that every client, which opens
#: its channels through fjord.tls, does not import the SCRAM machinery (scramp: ~30 ms).
SASL_SESSION_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "fjord_sasl_session_principal", default=None
)
