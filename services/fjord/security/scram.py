"""SCRAM credentials (RFC 5802/7677, Kafka's SCRAM-SHA-256 and SCRAM-SHA-512), pure.

A :class:`ScramCredential` is what the controller stores for one user and mechanism: salt,
iteration count, StoredKey and ServerKey. It never holds the password: StoredKey is
H(HMAC(SaltedPassword, "Client Key")), which lets a server check a client's proof but not
act as the client. The key derivation and the exchange itself are the ``scramp`` library's
(no hand-written crypto here); this module only names, validates and serialises.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fjord.errors import ConfigError, ErrorCode, FjordError

#: Kafka's mechanism names and wire types (AlterUserScramCredentials' ``mechanism`` byte).
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_MECHANISMS: dict[str, int] = {SCRAM_SHA_256: 1, SCRAM_SHA_512: 2}
MECHANISM_BY_TYPE: dict[int, str] = {v: k for k, v in SCRAM_MECHANISMS.items()}
#: Kafka's bounds on the iteration count (ScramMechanism.minIterations, 16384 upper bound of
#: AlterUserScramCredentials).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096


class ScramCredentialError(ConfigError):
    """A credential or mechanism Kafka would refuse (unknown mechanism, iterations out of
    range, a malformed stored credential)."""


def check_mechanism(mechanism: str) -> str:
    """``mechanism`` normalised (upper case), or ScramCredentialError naming the known ones."""
    name = mechanism.strip().upper()
    if name not in SCRAM_MECHANISMS:
        raise ScramCredentialError(
            f"unknown SCRAM mechanism {mechanism!r} (known: {', '.join(SCRAM_MECHANISMS)})"
        )
    return name


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramCredentialError(
            f"iterations {iterations} outside {MIN_ITERATIONS}..{MAX_ITERATIONS}"
        )
    return iterations


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One user's salted credential for one mechanism. Invariant: keys and salt non-empty,
    iterations within Kafka's bounds; no password anywhere."""

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __post_init__(self) -> None:
        check_mechanism(self.mechanism)
        check_iterations(self.iterations)
        if not (self.salt and self.stored_key and self.server_key):
            raise ScramCredentialError("a SCRAM credential needs salt, StoredKey and ServerKey")

    @classmethod
    def from_password(
        cls,
        mechanism: str,
        password: str,
        iterations: int = DEFAULT_ITERATIONS,
        salt: bytes | None = None,
    ) -> ScramCredential:
        """Derive the credential (a random salt unless given); the password is not kept."""
        name = check_mechanism(mechanism)
        check_iterations(iterations)
        if not password:
            raise ScramCredentialError("a SCRAM password must not be empty")
        from scramp import ScramMechanism  # here: clients import this module, rarely derive

        salt_out, stored, server, count = ScramMechanism(name).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
        return cls(name, salt_out, stored, server, count)

    @classmethod
    def from_salted_password(
        cls, mechanism: str, salt: bytes, salted_password: bytes, iterations: int
    ) -> ScramCredential:
        """Kafka's AlterUserScramCredentials upsertion (the client sends salt and
        SaltedPassword, not the password): StoredKey = H(HMAC(SaltedPassword, "Client Key")),
        ServerKey = HMAC(SaltedPassword, "Server Key") (RFC 5802), with the mechanism's hash
        as scramp names it and the standard library's HMAC."""
        name = check_mechanism(mechanism)
        if not salted_password:
            raise ScramCredentialError("a SCRAM salted password must not be empty")
        from scramp import ScramMechanism  # here: clients import this module, rarely derive

        hash_factory = ScramMechanism(name).hf
        client_key = hmac.new(salted_password, b"Client Key", hash_factory).digest()
        stored_key = hash_factory(client_key).digest()
        server_key = hmac.new(salted_password, b"Server Key", hash_factory).digest()
        return cls(name, salt, stored_key, server_key, iterations)

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """The tuple scramp's server asks for: (salt, StoredKey, ServerKey, iterations)."""
        return self.salt, self.stored_key, self.server_key, self.iterations

    def to_json(self) -> dict[str, object]:
        return {
            "mechanism": self.mechanism,
            "salt": base64.b64encode(self.salt).decode(),
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ScramCredential:
        try:
            return cls(
                str(data["mechanism"]),
                base64.b64decode(str(data["salt"]), validate=True),
                base64.b64decode(str(data["stored_key"]), validate=True),
                base64.b64decode(str(data["server_key"]), validate=True),
                int(str(data["iterations"])),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ScramCredentialError(f"malformed SCRAM credential: {exc}") from exc


#: ``lookup(mechanism, username)`` -> the user's credential, or None if none is stored.
CredentialLookup = Callable[[str, str], "ScramCredential | None"]


class ScramAlterationError(FjordError):
    """Why one user's credential changes were refused (Kafka's codes:
    UNSUPPORTED_SASL_MECHANISM, UNACCEPTABLE_CREDENTIAL, DUPLICATE_RESOURCE,
    RESOURCE_NOT_FOUND)."""


@dataclass(frozen=True, slots=True)
class ScramDeletion:
    user: str
    mechanism_type: int


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    """A credential as the client derived it from the password (no password here)."""

    user: str
    mechanism_type: int
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


def plan_alter_scram(
    current: Mapping[str, tuple[ScramCredential, ...]],
    deletions: Iterable[ScramDeletion],
    upsertions: Iterable[ScramUpsertion],
) -> tuple[dict[str, tuple[ScramCredential, ...]], dict[str, ScramAlterationError | None]]:
    """Kafka's AlterUserScramCredentials, pure: per user named, the error (None: applied);
    and the users whose credentials change with their new credentials (empty: delete the
    user's key). A user with any bad alteration gets no change at all; one user+mechanism
    named twice in the request is DUPLICATE_RESOURCE for that user."""
    items: list[ScramDeletion | ScramUpsertion] = [*deletions, *upsertions]
    errors: dict[str, ScramAlterationError | None] = {}
    seen: set[tuple[str, int]] = set()
    by_user: dict[str, dict[str, ScramCredential | None]] = {}

    def fail(user: str, code: ErrorCode, message: str) -> None:
        if errors.get(user) is None:
            errors[user] = ScramAlterationError(message, code)

    for item in items:
        errors.setdefault(item.user, None)
        if (item.user, item.mechanism_type) in seen:
            fail(item.user, ErrorCode.DUPLICATE_RESOURCE,
                 f"a credential of user {item.user!r} cannot be altered twice in one request")
        seen.add((item.user, item.mechanism_type))
    for item in items:
        user = item.user
        if not user:
            fail(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "username must not be empty")
            continue
        mechanism = MECHANISM_BY_TYPE.get(item.mechanism_type)
        if mechanism is None:
            fail(user, ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                 f"unknown SCRAM mechanism type {item.mechanism_type} (1: {SCRAM_SHA_256}, "
                 f"2: {SCRAM_SHA_512})")
            continue
        changes = by_user.setdefault(user, {})
        if isinstance(item, ScramDeletion):
            if not any(c.mechanism == mechanism for c in current.get(user, ())):
                fail(user, ErrorCode.RESOURCE_NOT_FOUND,
                     f"user {user!r} has no {mechanism} credential to delete")
            changes[mechanism] = None
            continue
        try:
            changes[mechanism] = ScramCredential(
                mechanism, item.salt, item.stored_key, item.server_key, item.iterations
            )
        except ScramCredentialError as exc:
            fail(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, f"user {user!r}: {exc}")
    changed: dict[str, tuple[ScramCredential, ...]] = {}
    for user, changes in by_user.items():
        if errors.get(user) is not None:
            continue
        kept = {c.mechanism: c for c in current.get(user, ())}
        for mechanism, credential in changes.items():
            if credential is None:
                kept.pop(mechanism, None)
            else:
                kept[mechanism] = credential
        changed[user] = tuple(kept[m] for m in sorted(kept))
    return changed, errors


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """A stored credential as described (Kafka's ScramCredentialInfo): no salt, no keys."""

    mechanism: str
    iterations: int


@dataclass(frozen=True, slots=True)
class UserScramCredentialUpsertion:
    """Set ``user``'s credential for ``mechanism`` from ``password`` (Kafka's
    UserScramCredentialUpsertion). The client derives salt, StoredKey and ServerKey; only
    those are sent."""

    user: str
    mechanism: str
    password: str
    iterations: int = DEFAULT_ITERATIONS


@dataclass(frozen=True, slots=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: str
