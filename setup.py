"""Builds lamina's optional C core, dispatch/csrc/ (everything else is in pyproject.toml).

The extension is optional: where it cannot be built (no compiler), the install goes on
and lamina uses its pure-Python core (dispatch/core.py warns once). Its source files
are compiled separately and linked into one module (Note [C core files] in
dispatch/csrc/core.h); the header is listed so that a change to it rebuilds them all
and the source distribution carries it.
"""

from glob import glob

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lamina.dispatch._core",
            sorted(glob("dispatch/csrc/*.c")),
            depends=sorted(glob("dispatch/csrc/*.h")),
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
