"""The defaults that more than one stage states, stated once: the config's schema declares them
(e2e/design/schema.py), the manifest's typed reader assumes them where a run recorded none
(e2e/rundir/manifest_model.py), and the statistics take them where a caller names none
(e2e/stats/changepoints.py). Plain values, no pydantic and nothing of a stage: any stage may read them."""

from typing import Final

ALPHA = 0.05  # stats.alpha: the family-wise error rate of a run's decisions (Holm)
MIN_EFFECT_PCT = 2.0  # stats.min_effect_pct: the smallest change a verdict calls slower or faster, %
ESTIMATOR: Final = "auto"  # stats.estimator: the server-corrected estimate where its timings allow, else the client's
DEFAULT_PASSES = 4  # run.passes unset: servers per arm, df 6 for the pooled comparison
