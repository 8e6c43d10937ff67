#!/usr/bin/env bash
# kernels_check on one GPU with vLLM 0.26.0 (H200): routing probes, the timed sweep (5 shapes x 6
# contexts, bf16), the fault sweep (bf16+fp16, 4096/4090) and the summary table, printed last.
# Run from the project checkout:
#   bash maintainers/gpu/kernels_full.sh --quick      # a few cells first (~1 min incl. vLLM import + JIT)
#   bash maintainers/gpu/kernels_full.sh              # the full sweep (budget: 3-4 min)
# Extra arguments go to `python3 -m kernels_check` (e.g. --run-id h200-full, --dtypes bf16,fp16).
# GPU_ENV=<path to gpu-env.sh> if vLLM is not importable yet; else the usual places are tried.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

if ! python3 -c "import vllm" >/dev/null 2>&1; then
    for f in "${GPU_ENV:-}" shared/device/p3/gpu-env.sh shared/device/gpu-env.sh \
             ../shared/device/p3/gpu-env.sh ../shared/device/gpu-env.sh; do
        if [ -n "$f" ] && [ -f "$f" ]; then source "$f"; break; fi
    done
fi
python3 -c "import vllm, torch; assert torch.cuda.is_available()" 2>/dev/null || {
    echo "error: need vLLM importable and a GPU (source gpu-env.sh or set GPU_ENV)" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null

start=$(date +%s)
python3 -m kernels_check --out results/kernels "$@"
rc=$?
echo "kernels_check exit $rc after $(( $(date +%s) - start )) s (0 all rows ok, 1 some rows failed/misrouted, 2 setup error)"
exit $rc
