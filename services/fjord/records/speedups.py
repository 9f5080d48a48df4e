"""Which implementation runs the record hot loops: the C extension or pure Python (issue 18).

``fjord.records._speedups`` (built from ``_speedups.c`` by the system's C compiler during
``pip install``) encodes records as the producer appends them and decodes them for the
consumer; :mod:`fjord.records.builder` and :mod:`fjord.records.reader` hold the same code in
pure Python, which stays the reference: both produce the same bytes and the same records, and
everything the C code does not handle itself (bytes-likes other than ``bytes``, headers to
encode, every malformed input) goes through the Python functions, so errors are the same too.

Chosen once, at import: the extension when it was built, pure Python when it was not or when
the environment sets ``FJORD_PURE_PYTHON=1`` (true, yes and on count too).
"""

from __future__ import annotations

import os
from types import ModuleType

#: The environment variable that forces the pure-Python implementation.
PURE_PYTHON_ENV = "FJORD_PURE_PYTHON"


def pure_python_forced() -> bool:
    """Whether ``FJORD_PURE_PYTHON`` asks for the pure-Python implementation."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _load_extension() -> ModuleType | None:
    try:
        from fjord.records import _speedups
    except ImportError:
        return None
    return _speedups


#: The compiled module, or None when it is not built (whatever FJORD_PURE_PYTHON says).
EXTENSION: ModuleType | None = _load_extension()

#: The implementation in use: ``"c"`` or ``"python"``.
IMPLEMENTATION = "c" if EXTENSION is not None and not pure_python_forced() else "python"

#: Whether :meth:`BatchBuilder.try_append` and ``build()`` are atomic against each other (the C
#: appender: neither releases the GIL), so that a producer may append to an open batch without
#: the accumulator's lock while the sender thread may close it.
ATOMIC_APPEND = IMPLEMENTATION == "c"
