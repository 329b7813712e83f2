#!/usr/bin/env bash
# Regenerates the Python and Go clients' protobuf code from ../proto into the packages' own
# folders (committed), offline, with Debian's packages only. See clients/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: clients/generate.sh [--no-build] [--help]

Regenerates the protobuf and gRPC code of the polyglot clients from proto/ into the
folders below. The generated code is committed, so that both clients install without
protoc: run it after changing proto/ and commit the result (CI regenerates it and fails when
it differs). Safe to run again: the generated trees are replaced as a whole, with the same
bytes from the same tools.

  clients/python/idempotency_client/_generated/
                          idempotency/v1/*_pb2.py, *_pb2_grpc.py and google/rpc/*_pb2.py,
                          part of the Python package idempotency_client (pip installs them)
  clients/go/gen/idempotency/v1/
                          the Go package <module>/gen/idempotency/v1 of the module in
                          clients/go (its go.mod), as the protos' go_package names it
  clients/go/vendor/      links to Debian's Go sources (go/debian-vendor.sh; unless --no-build;
                          git-ignored)
  clients/build/bin/      idem-lifecycle, the Go lifecycle check (built unless --no-build;
                          git-ignored)

Options:
  --no-build   generate only; do not vendor, vet and compile the Go client and its lifecycle
               program
  -h, --help   print this help

Needs (Debian 12):
  apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    protobuf-compiler-grpc python3-grpcio python3-protobuf golang-go protoc-gen-go \
    protoc-gen-go-grpc golang-google-grpc-dev golang-google-genproto-dev \
    golang-github-golang-protobuf-1-5-dev
  and, to install the Python package with pip, python3-venv python3-wheel.

Environment:
  GRPC_PYTHON_PLUGIN   the gRPC Python plugin (default: grpc_python_plugin on PATH)
  GOCACHE              Go build cache (default: clients/build/go-cache)
EOF
}

build_go=1
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --no-build) build_go=0 ;;
    *) echo "generate.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto="$(cd "$here/../proto" && pwd)"
build="$here/build"
gocode=/usr/share/gocode

# --- preflight: every tool and library, each with the Debian package that provides it ----------
missing=()
packages=()
need() { # $1: what is missing (for the message), $2: the Debian package
  missing+=("$1 (Debian package $2)"); packages+=("$2")
}
command -v protoc >/dev/null 2>&1 || need "protoc" protobuf-compiler
# protoc finds the well-known types (google/protobuf/*.proto) in /usr/include (libprotobuf-dev,
# only a recommendation of protobuf-compiler).
wkt_include=""
for dir in /usr/include /usr/local/include; do
  if [ -f "$dir/google/protobuf/duration.proto" ]; then wkt_include="$dir"; break; fi
done
[ -n "$wkt_include" ] || need "google/protobuf/*.proto (well-known types)" libprotobuf-dev
python_plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin 2>/dev/null || true)}"
[ -n "$python_plugin" ] && [ -x "$python_plugin" ] || need "grpc_python_plugin" protobuf-compiler-grpc
command -v protoc-gen-go >/dev/null 2>&1 || need "protoc-gen-go" protoc-gen-go
command -v protoc-gen-go-grpc >/dev/null 2>&1 || need "protoc-gen-go-grpc" protoc-gen-go-grpc
if [ "$build_go" = 1 ]; then
  command -v go >/dev/null 2>&1 || need "go" golang-go
  [ -d "$gocode/src/google.golang.org/grpc" ] || need "Go package google.golang.org/grpc" golang-google-grpc-dev
  [ -d "$gocode/src/google.golang.org/genproto/googleapis/rpc/errdetails" ] ||
    need "Go package google.golang.org/genproto/googleapis/rpc/errdetails" golang-google-genproto-dev
  [ -d "$gocode/src/google.golang.org/protobuf/types/known/durationpb" ] ||
    need "Go package google.golang.org/protobuf" golang-google-protobuf-dev
  # grpc-go decodes the APIv2 messages protoc-gen-go writes only with github.com/golang/protobuf
  # 1.4 or later (1.3 panics): Debian's golang-github-golang-protobuf-1-5-dev.
  if ! grep -qs 'google.golang.org/protobuf' "$gocode/src/github.com/golang/protobuf/proto/proto.go"; then
    need "Go package github.com/golang/protobuf >= 1.4" golang-github-golang-protobuf-1-5-dev
  fi
fi
if [ "${#missing[@]}" -gt 0 ]; then
  {
    echo "generate.sh: missing:"
    printf '  - %s\n' "${missing[@]}"
    echo "install them with:"
    echo "  apt-get install -y --no-install-recommends $(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')"
  } >&2
  exit 1
fi

# The same bytes from the same tools on every machine: the generated trees are committed, and CI
# (.ci/run) regenerates them and fails when they differ. LC_ALL=C fixes the order of the globs.
export LC_ALL=C
cd "$proto"
idem_files=(idempotency/v1/*.proto)
rpc_files=(google/rpc/status.proto google/rpc/error_details.proto)

# The Go package's import path is the one the protos' go_package options name: it must lie in
# the module of go/go.mod, the path the module is fetched by.
go_module="$(awk '$1 == "module" { print $2; exit }' "$here/go/go.mod")"
go_package="$go_module/gen/idempotency/v1;idempotencyv1"
for f in "${idem_files[@]}"; do
  if ! grep -qxF "option go_package = \"$go_package\";" "$f"; then
    echo "generate.sh: proto/$f: go_package must be \"$go_package\" (the module of clients/go/go.mod)" >&2
    exit 1
  fi
done

# --- Python -------------------------------------------------------------------------------------
# Into the package's own tree, python/idempotency_client/_generated (committed), so that `pip
# install clients/python` ships it. protoc writes absolute imports from the proto paths (`from
# idempotency.v1 import ...`, `from google.rpc import ...`); they are rewritten to the package's,
# so that nothing is installed as a top-level `idempotency` or `google.rpc` (which would clash
# with googleapis-common-protos). google/rpc/*.proto are generated from the repository's copies.
# grpc/health is not generated: a `grpc` folder would shadow the grpc runtime package.
py_package=idempotency_client._generated
py_out="$here/python/idempotency_client/_generated"
# pip builds in the folder: its build/ would otherwise keep modules of protos since removed.
rm -rf "$py_out" "$here/python/build" "$here/python/idempotency_client.egg-info"
mkdir -p "$py_out"
protoc -I . -I "$wkt_include" \
  --python_out="$py_out" \
  --grpc_out="$py_out" --plugin=protoc-gen-grpc="$python_plugin" \
  "${idem_files[@]}" "${rpc_files[@]}"
for dir in "$py_out" "$py_out/idempotency" "$py_out/idempotency/v1" "$py_out/google" "$py_out/google/rpc"; do
  echo "# Generated by clients/generate.sh; do not edit." >"$dir/__init__.py"
done
sed -i \
  -e "s/^from \(idempotency\.v1\|google\.rpc\) import /from $py_package.\1 import /" \
  -e "s/^\(_builder\.BuildTopDescriptorsAndMessages(DESCRIPTOR, '\)\(idempotency\.v1\|google\.rpc\)\./\1$py_package.\2./" \
  "$py_out"/*/*/*.py
if grep -rqE "^(from|import) (idempotency|google\.rpc)\b" "$py_out"; then
  grep -rnE "^(from|import) (idempotency|google\.rpc)\b" "$py_out" >&2
  echo "generate.sh: generated Python code still imports a top-level idempotency or google.rpc" >&2
  exit 1
fi
echo "generated Python into clients/python/idempotency_client/_generated"

# --- Go -----------------------------------------------------------------------------------------
# Into the module's own tree, go/gen/idempotency/v1: the package
# $go_module/gen/idempotency/v1, the import path the protos' go_package names (checked
# above). google.rpc.ErrorInfo/Status come from Debian's genproto (the same messages grpc-go
# itself uses); a second generated copy would register google/rpc/*.proto twice in one binary.
rm -rf "$here/go/gen"
protoc -I . -I "$wkt_include" \
  --go_out="$here/go" --go_opt=module="$go_module" \
  --go-grpc_out="$here/go" --go-grpc_opt=module="$go_module" \
  "${idem_files[@]}"
echo "generated Go into clients/go/gen/idempotency/v1"

if [ "$build_go" = 1 ]; then
  # Offline, in vendor mode: vendor/ links to Debian's sources (go/debian-vendor.sh), so the
  # go command reads no go.mod of a dependency and asks no proxy. -trimpath keeps the build
  # cache's entries independent of the folder, so a module of yours that vendors the same
  # sources reuses them.
  "$here/go/debian-vendor.sh"
  export GO111MODULE=on GOWORK=off GOPROXY=off GOFLAGS="-mod=vendor -trimpath"
  export GOCACHE="${GOCACHE:-$build/go-cache}"
  mkdir -p "$build/bin"
  (cd "$here/go" && go vet ./... && go build -o "$build/bin/idem-lifecycle" ./cmd/lifecycle)
  echo "built clients/build/bin/idem-lifecycle"
fi
