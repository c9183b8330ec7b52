"""Builds lamina's optional C core, dispatch/_core.c (everything else is in pyproject.toml).

The extension is optional: where it cannot be built (no compiler), the install goes on
and lamina uses its pure-Python core (dispatch/core.py warns once).
"""

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lamina.dispatch._core",
            ["dispatch/_core.c"],
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
