"""Build hook for the one optional C extension (exact resize kernels); all metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and Pillow does the resizing.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("irpe.artifact._resample", ["artifact/_resample.c"], optional=True,
                             extra_compile_args=["-O3", "-std=c99"])])
