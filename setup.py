"""Builds the optional C extension in native/ (zero-copy handoff); everything else is in pyproject.toml."""
from glob import glob

from setuptools import Extension, setup

native_sources = sorted(glob("native/*.c"))
ext_modules = (
    [Extension("mlharness.sut._native", sources=native_sources, extra_compile_args=["-O3", "-std=c11"])]
    if native_sources
    else []
)
setup(ext_modules=ext_modules)
