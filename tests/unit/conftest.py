"""Fixtures for the unit tests.

- ``records_implementation`` (module scope, parametrized ``python`` / ``c``): runs every test of
  a module that uses it once with the pure-Python record code and once with the C extension
  (issue 18: the same tests exercise both). It swaps the builder and decoders everywhere the
  tests and the library look them up (the test module's own names included). The ``c`` run is
  skipped, saying why, where the extension is not built or ``FJORD_PURE_PYTHON`` forces Python
  (``make test`` checks the extension is built before it runs the suite).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fjord.records
from fjord.records import builder, reader
from tests.helpers.records import RECORD_IMPLEMENTATIONS, record_implementation


@pytest.fixture(scope="module", params=RECORD_IMPLEMENTATIONS)
def records_implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    names = record_implementation(request.param)
    with pytest.MonkeyPatch.context() as patch:
        for module in (fjord.records, builder, reader, request.module):
            for name, value in names.items():
                if hasattr(module, name):
                    patch.setattr(module, name, value)
        yield request.param
