#!/usr/bin/env bash
# Run a command against a private, freshly started embedded stack (own ports and data dir),
# then stop it:  scripts/with_stack.sh python -m benchmarks.registry
set -euo pipefail
cd "$(dirname "$0")/.."
export LORAPLANE_STACK_PORT_BASE=${LORAPLANE_STACK_PORT_BASE:-25000}
export LORAPLANE_STACK_DATA_DIR=${LORAPLANE_STACK_DATA_DIR:-$PWD/.loraplane/bench-stack}
LP=.venv/bin/loraplane
trap '$LP stack down >/dev/null 2>&1 || true' EXIT
$LP stack up >/dev/null
set -a
eval "$($LP stack env)"
set +a
$LP db migrate >/dev/null
"$@"
