"""Build hook for the two C extensions (exact resize kernels; the iRPE ops for ONNX Runtime); all metadata is in
pyproject.toml.

Optional for users: without a C compiler the install still succeeds, Pillow does the resizing and ONNX Runtime
runs the iRPE lookups in standard ops. Required in CI (``IRPE_CI=1``, set by scripts/test.sh and .ci/run): a
compile failure fails the install there.
"""

import os

from setuptools import Extension, setup

_REQUIRED = os.environ.get("IRPE_CI", "") not in ("", "0")
setup(ext_modules=[Extension(f"irpe.artifact.{name}", [f"artifact/{name}.c"], optional=not _REQUIRED,
                             extra_compile_args=["-O3", "-std=c99"]) for name in ("_resample", "_ortops")])
