"""Refuses to build the package without its generated code (pyproject.toml has the rest)."""

import os
import sys

from setuptools import setup

_MARKER = os.path.join("idempotency_client", "_generated", "idempotency", "v1", "coordinator_pb2_grpc.py")

if not os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), _MARKER)):
    sys.exit(
        f"idempotency-client: {_MARKER} is missing: the generated code is committed with the package;"
        " copy the whole folder, or regenerate it with clients/generate.sh --no-build"
    )

setup()
