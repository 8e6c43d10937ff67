#!/usr/bin/env python3
"""Thin entry point: `python run_e2e.py --order widened-first`. See README.md."""

import sys

from e2e.cli import main

if __name__ == "__main__":
    sys.exit(main())
