"""gsm8k as the accuracy sign-off: task files, the lm-eval unit, the summary, and the step that runs
them (gsm8k_step.py: a run's last step and `run_e2e.py gsm8k`)."""
