"""SCRAM credentials (RFC 5802/7677, Kafka's SCRAM-SHA-256 and SCRAM-SHA-512), pure.

A :class:`ScramCredential` is what the controller stores for one user and mechanism: salt,
iteration count, StoredKey and ServerKey. It never holds the password: StoredKey is
H(HMAC(SaltedPassword, "Client Key")), which lets a server check a client's proof but not
act as the client. The key derivation and the exchange itself are the ``scramp`` library's
(no hand-written crypto here); this module only names, validates and serialises.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

from scramp import ScramMechanism

from fjord.errors import ConfigError

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
        salt_out, stored, server, count = ScramMechanism(name).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
        return cls(name, salt_out, stored, server, count)

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
