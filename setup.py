"""Build hook for the three C extensions (exact resize kernels; the iRPE ops for ONNX Runtime; the fused iRPE
attention for OpenVINO); all metadata is in pyproject.toml.

Optional for users: without a C compiler the install still succeeds, Pillow does the resizing and ONNX Runtime and
OpenVINO run the iRPE lookups in standard ops. Required in CI (``IRPE_CI=1``, set by scripts/test.sh and .ci/run):
a compile failure fails the install there.
"""

import os

from setuptools import Extension, setup

_REQUIRED = os.environ.get("IRPE_CI", "") not in ("", "0")
_SOURCES = {"_resample": [], "_ortops": [], "_ovops": ["artifact/ovops_kernel.c"]}  # beyond artifact/<name>.c
setup(ext_modules=[Extension(f"irpe.artifact.{name}", [f"artifact/{name}.c", *more], optional=not _REQUIRED,
                             depends=["artifact/ovops_kernel.h"] if more else [],
                             extra_compile_args=["-O3", "-std=c99"]) for name, more in _SOURCES.items()])
