"""gsm8k as the accuracy sign-off: task files, the lm-eval unit, the summary, the command."""
