#!/usr/bin/env bash
# Set up a venv and run `conveyor up`: scheduler, autoscaler and workers on the embedded
# default (SQLite, no services), with the example DAGs. Ctrl-C drains and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONVEYOR_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -e .
exec "$VENV/bin/conveyor" up "$@"
