#!/usr/bin/env bash
# One call: install part 4, build the twin, resume the partial 0.23.0 run OUTSIDE the synced checkout
# (/tmp/r), wait for it, packing to $OUT every 60 s.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
LIMIT=${1:-450}; T0=$(date +%s)
bash .gpu23/c4/p4/gpu-install.sh .gpu23/c4 || exit 1
cp .gpu23/c4/p4/gpu-env.sh /tmp/gpu-env-.gpu23.sh; source /tmp/gpu-env-.gpu23.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
GPU_ENV=/tmp/gpu-env-.gpu23.sh TOKENIZER_FROM=.gpu23/c4/tokenizers/gemma3 bash scripts/gpu/build_twin.sh > /tmp/twin.log 2>&1
echo "twin: exit $? at $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/r; cp -r results/h200-vllm023-tp1-partial /tmp/r/h200-vllm023-tp1
RUN=/tmp/r/h200-vllm023-tp1
setsid nohup python3 run_e2e.py --resume $RUN --no-progress > /tmp/run.log 2>&1 < /dev/null &
pack() { tar czf "$OUT/run.tgz" -C /tmp/r --exclude=vllm-cache h200-vllm023-tp1 2>/dev/null; cp /tmp/run.log /tmp/twin.log "$OUT/" 2>/dev/null; }
P=0
while [ $(( $(date +%s) - T0 )) -lt "$LIMIT" ] && pgrep -f "run_e2e.py --resume" >/dev/null; do
  sleep 5; if [ $(( $(date +%s) - P )) -ge 60 ]; then pack; P=$(date +%s); fi
done
pgrep -f "run_e2e.py --resume" >/dev/null && echo "run: still going" || echo "run: ended"
pack; tail -25 /tmp/run.log; echo "at $(( $(date +%s) - T0 )) s"
