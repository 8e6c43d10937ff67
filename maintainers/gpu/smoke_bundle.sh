#!/usr/bin/env bash
# Smoke-test another vLLM bundle on the GPU machine (configs/h200-smoke-vllm023.toml). Prepare here:
#   for i in 0 1 2 3 4; do mkdir -p .gpu23/c$i; cp -r .bundles/vllm-0.23.0/p$i .gpu23/c$i/; done
#   cp -r assets/tokenizers .gpu23/c4/; echo /.gpu23/ >> .git/info/exclude
# Then in quick succession: `bash maintainers/gpu/smoke_bundle.sh stage N` for N = 0..3 (carry .gpu23/cN),
# and `bash maintainers/gpu/smoke_bundle.sh run` carrying .gpu23/c4: installs, builds the twin, runs the
# config in the foreground and returns the run folder ($OUT/run.tgz) and its log.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=.gpu23; LAST=4; CONFIG=${CONFIG:-configs/h200-smoke-vllm023.toml}; RUN=results/$(basename "$CONFIG" .toml)
case "${1:?usage: smoke_bundle.sh stage N | run}" in
  stage) bash "$B/c$2/p$2/gpu-install.sh" "$B/c$2" ;;
  run)
    bash "$B/c$LAST/p$LAST/gpu-install.sh" "$B/c$LAST" || exit 1
    source "$B/c$LAST/p$LAST/gpu-env.sh"
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -3
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
    T0=$(date +%s)
    GPU_ENV="$B/c$LAST/p$LAST/gpu-env.sh" TOKENIZER_FROM="$B/c$LAST/tokenizers/gemma3" bash maintainers/gpu/build_twin.sh > /tmp/twin.log 2>&1
    echo "twin: exit $? in $(( $(date +%s) - T0 )) s"
    timeout "${RUN_LIMIT:-400}" python3 run_e2e.py --config "$CONFIG" --run-id "$(basename "$RUN")" --no-progress > /tmp/run.log 2>&1
    echo "run: exit $?"; tail -25 /tmp/run.log
    [ -n "${OUT:-}" ] && { tar czf "$OUT/run.tgz" "$RUN" 2>/dev/null; cp /tmp/run.log "$OUT/"; } ;;
esac
