"""Build the optional native parts (record decoders, ingest columns, the local store's batch
writes); metadata is in pyproject.toml."""

from setuptools import Extension, setup

COMMON = {
    "extra_compile_args": [
        "-O2",
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Wno-missing-field-initializers",
    ],
    "depends": ["protocol/native_common.h"],
    "optional": True,
}

setup(
    ext_modules=[
        Extension("protocol._fastrecords", ["protocol/_fastrecords.c"], **COMMON),
        Extension("ingest_job._columnar", ["ingest_job/_columnar.c"], **COMMON),
        Extension("segments._localio", ["segments/_localio.c"], **COMMON),
    ]
)
