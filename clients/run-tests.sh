#!/usr/bin/env bash
# Generates the clients' code, then runs the Python and the Go lifecycle checks, and the
# Python examples of the documentation, against a running coordinator. See clients/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: clients/run-tests.sh [--no-generate] [--help]

Runs clients/generate.sh, then the Python lifecycle check (clients/python/test_lifecycle.py,
with /usr/bin/python3, importing idempotency_client from its source folder), the Python
examples of clients/README.md and of the package's docstring, run as written
(clients/python/test_examples.py), and the Go lifecycle check (clients/build/bin/idem-lifecycle,
built from the module in clients/go) against a running coordinator. Exits non-zero if any
fails. test/clients/polyglot.test.ts runs the same checks with both clients installed the way
a user installs them (clients/README.md).

Environment (required):
  IDEM_TARGET          host:port of the coordinator's RPC port, e.g. 127.0.0.1:7070
  IDEM_GATEWAY_TOKEN   gateway-role token granted IDEM_TENANT (acme) and payments.create
  IDEM_WORKER_TOKEN    worker-role token granted the same
Optional: IDEM_TENANT, IDEM_PRINCIPAL, IDEM_OPERATION, IDEM_API_REVISION (the policy must
fingerprint the raw body), PYTHON (default /usr/bin/python3: Debian's interpreter, which has
python3-grpcio and python3-protobuf). The examples name tenant acme, principal alice and
payments.create revision 1 as they are written, whatever these say.

Options:
  --no-generate   use the generated code and clients/build/bin as they are
  -h, --help      print this help
EOF
}

generate=1
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --no-generate) generate=0 ;;
    *) echo "run-tests.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

missing_env=()
for name in IDEM_TARGET IDEM_GATEWAY_TOKEN IDEM_WORKER_TOKEN; do
  [ -n "${!name:-}" ] || missing_env+=("$name")
done
if [ "${#missing_env[@]}" -gt 0 ]; then
  echo "run-tests.sh: set ${missing_env[*]} (try --help)" >&2
  exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-/usr/bin/python3}"
if ! "$python" -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "run-tests.sh: $python cannot import grpc and google.protobuf:" \
    "apt-get install -y --no-install-recommends python3-grpcio python3-protobuf" >&2
  exit 1
fi

if [ "$generate" = 1 ]; then
  "$here/generate.sh"
fi

status=0
echo "== Python client ($python)"
"$python" "$here/python/test_lifecycle.py" || status=1
echo "== Python examples"
"$python" "$here/python/test_examples.py" "$here/README.md" || status=1
echo "== Go client"
"$here/build/bin/idem-lifecycle" || status=1
exit "$status"
