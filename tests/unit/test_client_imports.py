"""What importing the clients costs: a process that only produces, consumes or administers (Spark's
offsets process starts one per streaming query and imports fjord.client there) must not load the
SCRAM machinery (scramp and its asn1crypto, ~30 ms) that only a SASL login or a credential
derivation uses."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_clients_loads_no_scram_library() -> None:
    code = (
        "import sys\n"
        "import fjord.client, fjord.tls, fjord.security.scram\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scramp', 'asn1crypto')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_credential_is_still_derived_with_scramp() -> None:
    from fjord.security.scram import ScramCredential

    credential = ScramCredential.from_password("SCRAM-SHA-256", "secret", salt=b"sixteen-byte-salt")
    assert credential.iterations == 4096
    assert len(credential.stored_key) == 32
