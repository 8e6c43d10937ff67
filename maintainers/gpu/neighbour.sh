#!/usr/bin/env bash
# Issue 23, item 6, on one H200: contaminate a cell mid-measurement, on purpose, to see the harness
# notice. Beside a run started by reference_tp1.sh (stage 3 starts it detached), in the next call:
#   setsid nohup bash maintainers/gpu/neighbour.sh results/h200-reference-tp1 p1-d8192-stock 60 \
#     > /tmp/neighbour.log 2>&1 < /dev/null &
# (reference_tp1.sh's poll brings /tmp/neighbour.log back with the run.) It waits until the cell has a
# timed request row in the run's requests.jsonl (it is measuring), then runs a bandwidth-heavy torch
# process on the same GPU for SECONDS: device-to-device copies of 2 GiB back to back (~4.3 TB/s here).
# Expected with run.gpu_exclusive = retry (the default): the cell's attempt is voided at its next round
# ("GPU not exclusive"), the next server's pre-start reading waits for the neighbour to go (up to
# gpu_state.PRESTART_WAIT_S = 120 s), the cell is measured again, and its row lists the voided attempt
# in gpu_state.contaminated_attempts (pid and name as printed below). --gpu-exclusive warn: the cell
# is counted and marked contaminated instead; fail: the run stops.
set -uo pipefail
RUN=${1:?usage: neighbour.sh RUN_DIR CELL_ID [SECONDS] [GPU]}
CELL=${2:?cell id, e.g. p1-d8192-stock}
SECONDS_ON=${3:-60}
GPU=${4:-0}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
stamp() { date -u +%FT%TZ; }

echo "$(stamp) waiting for $CELL in $RUN/requests.jsonl"
# store.append writes rows with json.dumps' default separators: "cell_id": "<id>"
until grep -q "\"cell_id\": \"$CELL\"" "$RUN/requests.jsonl" 2>/dev/null; do sleep 0.5; done
echo "$(stamp) $CELL is measuring: neighbour on GPU $GPU for $SECONDS_ON s"
CUDA_VISIBLE_DEVICES=$GPU python3 - "$SECONDS_ON" <<'EOF'
import os, sys, time
import torch

seconds = float(sys.argv[1])
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB, twice: fits beside a server at 0.9
b = torch.empty_like(a)
print(f"neighbour pid {os.getpid()} on {torch.cuda.get_device_name()}", flush=True)
t0, n = time.time(), 0
while time.time() - t0 < seconds:
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    n += 20
dt = time.time() - t0
print(f"{n} copies of 2 GiB in {dt:.1f} s: {2 * n * a.numel() / dt / 1e9:.0f} GB/s read + written", flush=True)
EOF
rc=$?
echo "$(stamp) neighbour done (exit $rc)"
