#!/usr/bin/env bash
# Writes a module's vendor/ from Debian's Go packages (/usr/share/gocode), so that it builds
# offline in Go's vendor mode: the Go client itself, or a module of yours that requires it.
# See clients/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: clients/go/debian-vendor.sh [MODULE_DIR]
       clients/go/debian-vendor.sh --help

Makes the module in MODULE_DIR (default: the Go client, clients/go) build offline with
Debian 12's Go packages, in Go's vendor mode:

  GOFLAGS=-mod=vendor GOPROXY=off go build ./...

It replaces MODULE_DIR/vendor/ as a whole (run it again after editing go.mod) with
  - a link vendor/<module> -> /usr/share/gocode/src/<module> for each module the client's
    go.mod requires (grpc-go, protobuf, genproto, golang.org/x/{net,sys,text}), at the
    versions Debian ships;
  - for a module other than the client, a link vendor/<client module> to this folder, which
    that module's go.mod must require and replace with this folder (a checkout's clients/go,
    or a copy of it inside your repository):
      go mod edit \
        -require=github.com/idempotency-coordinator/idempotency-coordinator/clients/go@v0.0.0 \
        -replace=github.com/idempotency-coordinator/idempotency-coordinator/clients/go=/path/to/clients/go
  - vendor/modules.txt, which the go command checks against go.mod.
It adds the modules it links from Debian to MODULE_DIR's go.mod requirements where they are
missing (Go 1.17 and later want every module that provides a package listed there), and
stops before writing anything when go.mod asks for what it cannot provide.

The client's generated package (clients/go/gen/idempotency/v1) is committed with it; after
changing proto/, clients/generate.sh --no-build writes it again.

Options:
  -h, --help   print this help
EOF
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "debian-vendor.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac
[ "$#" -le 1 ] || { echo "debian-vendor.sh: one MODULE_DIR at most (try --help)" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
client="$(awk '$1 == "module" { print $2; exit }' "$here/go.mod")" # the client's module path
gocode=/usr/share/gocode/src
target="$(cd "${1:-$here}" && pwd)"
fail() { echo "debian-vendor.sh: $*" >&2; exit 1; }
[ -f "$target/go.mod" ] || fail "$target has no go.mod"
command -v go >/dev/null 2>&1 || fail "go is missing: apt-get install -y --no-install-recommends golang-go"

# The require and replace directives of a go.mod, one a line: "require PATH VERSION" or
# "replace OLD [VERSION] => NEW [VERSION]".
directives() {
  go mod edit -print "$1" | awk '
    { sub(/\/\/.*/, "") }
    /^\)/ { block = ""; next }
    $2 == "(" { block = $1; next }
    block != "" && NF > 0 { print block, $0; next }
    $1 == "require" || $1 == "replace" { print }'
}

# The Debian package of each module, for the message when it is missing.
debian_package() {
  case "$1" in
    google.golang.org/grpc) echo golang-google-grpc-dev ;;
    google.golang.org/genproto) echo golang-google-genproto-dev ;;
    google.golang.org/protobuf) echo golang-google-protobuf-dev ;;
    github.com/golang/protobuf) echo golang-github-golang-protobuf-1-5-dev ;;
    golang.org/x/*) echo "golang-golang-x-${1#golang.org/x/}-dev" ;;
    *) echo "the one that provides $gocode/$1" ;;
  esac
}

declare -A wanted=() # what MODULE_DIR's go.mod requires: path -> version
replaced_new=""      # the folder MODULE_DIR's go.mod replaces the client with, as written
replaced_any=0       # 1 when that replace names no version (replaces every version)
while read -r kind path rest; do
  if [ "$kind" = require ]; then
    wanted[$path]=$rest
  elif [ "$path" = "$client" ]; then
    read -r old_version arrow new _ <<<"$rest"
    if [ "$old_version" = "=>" ]; then replaced_any=1 new=$arrow; fi
    replaced_new=$new
  fi
done < <(directives "$target/go.mod")

# Debian's modules: what the client's go.mod requires, "PATH VERSION" each.
mapfile -t debian < <(directives "$here/go.mod" | awk '$1 == "require" { print $2, $3 }')

# Every check before anything is written.
for module in "${debian[@]}"; do
  read -r path version <<<"$module"
  [ -d "$gocode/$path" ] ||
    fail "$gocode/$path is missing: apt-get install -y --no-install-recommends $(debian_package "$path")"
  [ -z "${wanted[$path]:-}" ] || [ "${wanted[$path]}" = "$version" ] ||
    fail "$target/go.mod requires $path ${wanted[$path]}, but Debian ships $version: require $version"
done
if [ "$target" != "$here" ]; then
  [ -n "${wanted[$client]:-}" ] && [ -n "$replaced_new" ] ||
    fail "$target/go.mod must require $client and replace it with $here:
  (cd $target && go mod edit -require=$client@v0.0.0 -replace=$client=$here)"
  replacement="$(cd "$target" && cd "$replaced_new" 2>/dev/null && pwd)" ||
    fail "$target/go.mod replaces $client with $replaced_new, which is not a folder"
  [ "$replacement" -ef "$here" ] || fail "$target/go.mod replaces $client with $replaced_new, not with $here"
  [ -d "$here/gen/idempotency/v1" ] ||
    fail "$here/gen/idempotency/v1 is missing: it is part of the module (copy it along, or run clients/generate.sh --no-build)"
fi
unprovided=()
for path in "${!wanted[@]}"; do
  [ "$path" = "$client" ] || printf '%s\n' "${debian[@]%% *}" | grep -qxF "$path" || unprovided+=("$path")
done
[ "${#unprovided[@]}" -eq 0 ] ||
  fail "$target/go.mod requires what Debian's packages and the client do not provide: ${unprovided[*]}"

rm -rf "$target/vendor"
mkdir -p "$target/vendor"
modules_txt="$target/vendor/modules.txt"
# vendor/$1 -> $2, and its entry in modules.txt as `go mod vendor` writes it: "# PATH VERSION
# [=> REPLACEMENT]", then "## explicit; go VERSION" (explicit: go.mod requires it; the go version
# of the module's go.mod, which its packages are compiled with), then every package in the
# folder (so that each package is known to belong to the module).
vendor_module() { # $1: module path, $2: its folder, $3: version, $4: "=> replacement" or ""
  mkdir -p "$(dirname "$target/vendor/$1")"
  ln -s "$2" "$target/vendor/$1"
  echo "# $1 $3${4:+ $4}" >>"$modules_txt"
  local go_version
  go_version="$(awk '$1 == "go" { print $2 }' "$2/go.mod" 2>/dev/null || true)"
  echo "## explicit${go_version:+; go $go_version}" >>"$modules_txt"
  (cd "$2" && find . -mindepth 1 -type d \( -name testdata -o -name vendor -o -name '[._]*' \) -prune \
    -o -type f -name '*.go' ! -name '*_test.go' -printf '%h\n') |
    sort -u | sed -e "s#^\.\$#$1#" -e "s#^\./#$1/#" >>"$modules_txt"
}

[ "$target" = "$here" ] || vendor_module "$client" "$here" "${wanted[$client]}" "=> $replaced_new"
for module in "${debian[@]}"; do
  read -r path version <<<"$module"
  if [ -z "${wanted[$path]:-}" ]; then
    # Go 1.17 and later want every module that provides a package required in go.mod.
    go mod edit -require="$path@$version" "$target/go.mod"
    echo "added to $target/go.mod: require $path $version"
  fi
  vendor_module "$path" "$gocode/$path" "$version" ""
done
# A replace without a version on its left is recorded once more, on its own.
[ "$replaced_any" = 0 ] || echo "# $client => $replaced_new" >>"$modules_txt"
echo "vendored $target/vendor: $(grep -c '^# [^ ]* v' "$modules_txt") modules"
