"""Build hook for the one C extension (exact resize kernels); all metadata is in pyproject.toml.

Optional for users: without a C compiler the install still succeeds and Pillow does the resizing. Required in
CI (``IRPE_CI=1``, set by scripts/test.sh and .ci/run): a compile failure fails the install there.
"""

import os

from setuptools import Extension, setup

_REQUIRED = os.environ.get("IRPE_CI", "") not in ("", "0")
setup(ext_modules=[Extension("irpe.artifact._resample", ["artifact/_resample.c"], optional=not _REQUIRED,
                             extra_compile_args=["-O3", "-std=c99"])])
