#!/usr/bin/env bash
# The docs site: docs/ -> site/ with mkdocs-material, `mkdocs build --strict` (a broken link, a page
# missing from the nav or a failed reference page fails it). The reference pages (every CLI flag,
# config key and run-folder field) are generated from the code at build time (docs/gen_reference.py).
# Its own venv (E2E_DOCS_VENV, default .venv-docs) with the project's core dependencies and the
# `docs` extra: the build imports e2e but needs no vLLM. Idempotent: a finished setup is stamped.
# Extra arguments go to mkdocs build (e.g. --site-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${E2E_DOCS_VENV:-.venv-docs}
STAMP="$VENV/.e2e-docs-$(sha256sum scripts/docs.sh pyproject.toml | sha256sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PIP="$VENV/bin/python -m pip -q --disable-pip-version-check"
  # the same editable install as scripts/setup.sh (setuptools backend, no isolation)
  $PIP install 'setuptools>=70' wheel
  $PIP install --no-build-isolation -e '.[docs]'
  touch "$STAMP"
fi
NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict --clean "$@"
echo "docs ok: mkdocs build --strict"
