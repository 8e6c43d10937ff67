"""The one rule for comparing a committed results file with what the code computes now
(tests/guarantees/test_results_rerender.py's summaries, tests/unit/report/test_grid.py's grid.json): e2e/report/rerender.py's,
the rule `report` keeps a committed summary by (floats to REL relative, every other value exactly)."""

from e2e.report.rerender import REL as REL
from e2e.report.rerender import differs as differs
