"""Refuses to build the package without its generated code (pyproject.toml has the rest)."""

import os
import sys

from setuptools import setup

_MARKER = os.path.join("idempotency_client", "_generated", "idempotency", "v1", "coordinator_pb2_grpc.py")

if not os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), _MARKER)):
    sys.exit(f"idempotency-client: {_MARKER} is missing: run clients/generate.sh first")

setup()
