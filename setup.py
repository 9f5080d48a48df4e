"""The one thing pyproject.toml cannot declare: the C extension fjord.records._speedups (issue 18),
built by the system's C compiler during ``pip install`` (``make install`` / ``make test``).

It is optional: where it cannot be built, fjord runs the same code paths in pure Python
(fjord.records.speedups picks the implementation at import; FJORD_PURE_PYTHON=1 forces Python).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fjord.records._speedups",
            sources=["services/fjord/records/_speedups.c"],
            extra_compile_args=[
                "-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
            ],
            optional=True,
        )
    ]
)
