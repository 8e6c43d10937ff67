#!/usr/bin/env bash
# Lint, format and types: ruff (check and format --check) and mypy (strict on e2e/design, e2e/rundir,
# e2e/stats; mypy's defaults elsewhere: pyproject.toml). `.ci/run` runs this before the tests.
# Sets up first, so it works on a fresh clone. `bash scripts/lint.sh --fix` applies ruff's fixes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff check --fix . && .venv/bin/ruff format .
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
echo "lint ok: ruff, ruff format, mypy"
