#!/usr/bin/env bash
# One GPU lease, planned (30 min of device time; 10 min per command; 30 s warm between calls):
#   call 1-4:  bash maintainers/gpu/lease.sh stage N        (carry .gpu/cN; N = 0..3)
#   call 4 continues: bash maintainers/gpu/lease.sh checks  (kernels_check on GPU 0 while gsm8k runs on GPU 1)
#   call 5:    bash maintainers/gpu/lease.sh proof          (the plugin/routing proof at tensor parallel 2)
# Run folders go to results/ on the machine and come back as tarballs in $OUT (which returns at most
# 8 files, 2 folders down).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
env_on() { source .gpu/c3/p3/gpu-env.sh 2>/dev/null || source /tmp/gpu-stage/gpu-env.sh; }
case "$1" in
  stage) bash maintainers/gpu/stage.sh "$2" ;;
  checks)
    env_on
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    (CUDA_VISIBLE_DEVICES=0 timeout 400 bash maintainers/gpu/kernels_full.sh --run-id h200-kernels >/tmp/k.log 2>&1
     echo "kernels exit $?" >>/tmp/k.log) &
    (CUDA_VISIBLE_DEVICES=1 OUT= RUN_ID=h200-gsm8k-smollm2 timeout 440 bash maintainers/gpu/gsm8k_full.sh >/tmp/g.log 2>&1
     echo "gsm8k exit $?" >>/tmp/g.log) &
    wait
    tar czf "$OUT/kernels.tgz" results/kernels 2>/dev/null
    tar czf "$OUT/gsm8k.tgz" results/h200-gsm8k-smollm2 2>/dev/null
    cp /tmp/k.log "$OUT/kernels.log"; cp /tmp/g.log "$OUT/gsm8k.log"
    echo "===== gsm8k"; tail -25 /tmp/g.log; echo "===== kernels"; tail -45 /tmp/k.log ;;
  proof)
    env_on
    cp -n .gpu/c3/p3/gpu-env.sh /tmp/gpu-stage/gpu-env.sh 2>/dev/null
    OUT_SAVE=$OUT
    OUT= RUN_ID=h200-plugin-proof timeout 560 bash maintainers/gpu/plugin_proof.sh >/tmp/p.log 2>&1
    echo "proof exit $?" >>/tmp/p.log
    tar czf "$OUT_SAVE/proof.tgz" results/h200-plugin-proof 2>/dev/null
    cp /tmp/p.log "$OUT_SAVE/proof.log"; tail -60 /tmp/p.log ;;
esac
