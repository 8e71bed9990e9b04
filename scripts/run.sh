#!/usr/bin/env bash
# Set up a venv and run the main job on the embedded default (no services needed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONVEYOR_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -e .
exec "$VENV/bin/conveyor" demo "$@"
