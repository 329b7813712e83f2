#!/usr/bin/python3
"""Runs the Python client's documented examples, as written, against a running coordinator.

The examples are the ``python`` block of the "Python" section of clients/README.md and the
``Example::`` of the package's docstring (``idempotency_client.__doc__``, as installed). Each
runs twice with the same new key, with ``token``, ``key`` and ``charge`` (a fake card provider)
defined and its ``"127.0.0.1:7070"`` pointed at IDEM_TARGET: the first run must be accepted and
charge once, the second must replay and charge nothing, and each must print what the
example's comments say it prints.

Usage: test_examples.py [README]   (default: the README.md of this script's parent folder)

Environment:
    IDEM_TARGET          host:port of the coordinator's gRPC port, e.g. 127.0.0.1:7070
    IDEM_GATEWAY_TOKEN   a token with the gateway role for tenant acme and operation
                         payments.create (revision 1, raw fingerprint mode)

Prints one line per check (``PASS <check>: …`` or ``FAIL <check>: …``) and exits non-zero at
the first failure.
"""

import contextlib
import io
import os
import re
import sys
import textwrap
import uuid

import idempotency_client

#: The target the examples name: `npm start`'s.
EXAMPLE_TARGET = '"127.0.0.1:7070"'
SNAPSHOT_LINE = "201 b'{\"id\":\"p_1\"}'"


class CheckFailed(Exception):
    pass


def readme_example(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Python\n", 1)
    match = re.search(r"^```python\n(.*?)^```", section[1], re.S | re.M) if len(section) == 2 else None
    if match is None:
        raise CheckFailed(f"{path} has no python block in a '## Python' section")
    return match.group(1)


def docstring_example() -> str:
    doc = idempotency_client.__doc__ or ""
    if "Example::\n" not in doc:
        raise CheckFailed("the idempotency_client docstring has no 'Example::'")
    lines = []
    for line in doc.split("Example::\n", 1)[1].splitlines():
        if line.strip() and not line.startswith(" "):
            break  # the end of the indented block
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def run_example(source: str, where: str, target: str, token: str, key: str):
    """Runs the example once; returns what it printed, line by line, and the keys it charged with."""
    if EXAMPLE_TARGET not in source:
        raise CheckFailed(f"{where}: the example does not name {EXAMPLE_TARGET}")
    charged = []

    def charge(idempotency_key):
        charged.append(idempotency_key)
        return f"ch_{len(charged)}"

    namespace = {"__name__": "__example__", "token": token, "key": key, "charge": charge}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source.replace(EXAMPLE_TARGET, repr(target)), where, "exec"), namespace)
    return printed.getvalue().splitlines(), charged


def check_example(source, where, target, token, first_expected, again_expected):
    key = str(uuid.uuid4())
    printed, charged = run_example(source, where, target, token, key)
    if printed != first_expected:
        raise CheckFailed(f"{where}: the first run printed {printed}, expected {first_expected}")
    if len(charged) != 1 or len(charged[0]) != 43:
        raise CheckFailed(f"{where}: the first run charged {charged}, expected once with a 43-character key")
    printed, charged_again = run_example(source, where, target, token, key)
    if printed != again_expected:
        raise CheckFailed(f"{where}: the run with the same key printed {printed}, expected {again_expected}")
    if charged_again:
        raise CheckFailed(f"{where}: the run with the same key charged again: {charged_again}")
    return f"{' / '.join(first_expected)}; again: {' / '.join(again_expected)}; charged once"


def main() -> int:
    target = os.environ.get("IDEM_TARGET", "")
    token = os.environ.get("IDEM_GATEWAY_TOKEN", "")
    if not target or not token:
        print("set IDEM_TARGET and IDEM_GATEWAY_TOKEN", file=sys.stderr)
        return 2
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
    print(f"using idempotency_client from {os.path.dirname(idempotency_client.__file__)}", flush=True)

    checks = [
        (
            "readme-example",
            lambda: check_example(
                readme_example(readme), "clients/README.md", target, token,
                ["ACCEPTED EXECUTING", "SUCCEEDED", "SUCCEEDED CONFIRMED", SNAPSHOT_LINE],
                ["REPLAY SUCCEEDED", SNAPSHOT_LINE],
            ),
        ),
        (
            "docstring-example",
            lambda: check_example(
                docstring_example(), "idempotency_client.__doc__", target, token,
                ["ACCEPTED", "SUCCEEDED", "SUCCEEDED CONFIRMED"],
                ["REPLAY", "SUCCEEDED CONFIRMED"],
            ),
        ),
    ]
    for name, check in checks:
        try:
            detail = check()
        except Exception as error:  # the examples' own errors are failures too, named here
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
            return 1
        print(f"PASS {name}: {detail}", flush=True)
    print(f"python examples: all {len(checks)} checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
