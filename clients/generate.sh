#!/usr/bin/env bash
# Regenerates the Python and Go clients' protobuf code from ../proto into clients/build/,
# offline, with Debian's packages only. See clients/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: clients/generate.sh [--no-build] [--help]

Regenerates the protobuf and gRPC code of the polyglot clients from proto/ into
clients/build/ (git-ignored; never commit it). Safe to run again: the generated
trees are replaced as a whole.

  clients/build/python/   idempotency/v1/*_pb2.py, *_pb2_grpc.py and google/rpc/*_pb2.py,
                          for clients/python/idempotency_client.py (put on sys.path by it)
  clients/build/go/       a GOPATH tree: the generated package
                          example.com/idempotency/gen/idempotency/v1 and a link to
                          clients/go as example.com/idempotency/clients/go
  clients/build/bin/      idem-lifecycle, the Go lifecycle check (built unless --no-build)

Options:
  --no-build   generate only; do not compile the Go client and its lifecycle program
  -h, --help   print this help

Needs (Debian 12):
  apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    protobuf-compiler-grpc python3-grpcio python3-protobuf golang-go protoc-gen-go \
    protoc-gen-go-grpc golang-google-grpc-dev golang-google-genproto-dev \
    golang-github-golang-protobuf-1-5-dev

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

cd "$proto"
idem_files=(idempotency/v1/*.proto)
rpc_files=(google/rpc/status.proto google/rpc/error_details.proto)

# --- Python -------------------------------------------------------------------------------------
# google/rpc/*.proto are generated from the repository's copies. grpc/health is not: a generated
# top-level `grpc` folder would collide with the grpc runtime package.
rm -rf "$build/python"
mkdir -p "$build/python"
protoc -I . -I "$wkt_include" \
  --python_out="$build/python" \
  --grpc_out="$build/python" --plugin=protoc-gen-grpc="$python_plugin" \
  "${idem_files[@]}" "${rpc_files[@]}"
echo "generated Python into ${build#"$here"/..}/python"

# --- Go -----------------------------------------------------------------------------------------
# One GOPATH tree (GO111MODULE=off, GOPATH=clients/build/go:/usr/share/gocode): the generated
# package under the import path below, the hand-written client linked in next to it. The
# import path is given with M flags so that it does not depend on the protos' go_package.
# google.rpc.ErrorInfo/Status come from Debian's genproto (the same messages grpc-go itself
# uses); generating a second copy would register google/rpc/*.proto twice in one binary.
go_import="example.com/idempotency/gen/idempotency/v1"
rm -rf "$build/go/src"
mkdir -p "$build/go/src/$go_import" "$build/go/src/example.com/idempotency/clients"
m_flags=()
for f in "${idem_files[@]}"; do
  m_flags+=("--go_opt=M$f=$go_import;idempotencyv1" "--go-grpc_opt=M$f=$go_import;idempotencyv1")
done
protoc -I . -I "$wkt_include" \
  --go_out="$build/go/src" --go_opt=paths=import \
  --go-grpc_out="$build/go/src" --go-grpc_opt=paths=import \
  "${m_flags[@]}" \
  "${idem_files[@]}"
ln -s ../../../../../../go "$build/go/src/example.com/idempotency/clients/go"
echo "generated Go into ${build#"$here"/..}/go/src/$go_import"

if [ "$build_go" = 1 ]; then
  export GO111MODULE=off GOFLAGS="" GOPATH="$build/go:$gocode"
  export GOCACHE="${GOCACHE:-$build/go-cache}"
  mkdir -p "$build/bin"
  go vet example.com/idempotency/clients/go/idempotency example.com/idempotency/clients/go/cmd/lifecycle
  go build -o "$build/bin/idem-lifecycle" example.com/idempotency/clients/go/cmd/lifecycle
  echo "built ${build#"$here"/..}/bin/idem-lifecycle"
fi
