#!/usr/bin/env bash
# Routing records from every vLLM process on the H200 (vLLM 0.26.0), through the harness only.
#
#   bash maintainers/gpu/plugin_proof.sh            (from the checkout root, after gpu-install.sh)
#
# Four server starts (about 2 min each), one depth, per-arm-pass servers, PIECEWISE graphs so the
# attention runs eagerly on every step and the counts are per step:
#   fa / triton                FLASH_ATTN vs TRITON_ATTN: the implementation each layer class used
#   rocm-stock / rocm-widened  ROCM_ATTN forced on CUDA: the gate is False on NVIDIA, so every layer
#                              must take kernel_paged_attention_2d in both arms (widened applied in all)
# Tensor parallel 2 when two GPUs are lent, else 1 (the summary says which).
# Needs: the vLLM bundle installed (shared/device/gpu-install.sh) and a tokenizer folder
# (TOKENIZER_FROM, default assets/SmolLM2-135M-Instruct: only its tokenizer* files are read) unless
# the model folder exists already. Writes the run under $OUT (the device tool's folder) or results/.
set -euo pipefail
cd "$(dirname "$0")/../.."

for f in "${GPU_ENV:-}" shared/device/gpu-env.sh shared/device/p3/gpu-env.sh /work/shared/device/gpu-env.sh; do
  if [[ -n "$f" && -f "$f" ]]; then source "$f"; break; fi
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

VLLM_VERSION=$(python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1 || true)
if [[ -z "$VLLM_VERSION" ]]; then
  echo "error: vllm does not import: install the bundle (shared/device/*/gpu-install.sh) and source gpu-env.sh" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
TP=$([[ "${NGPU:-0}" -ge 2 ]] && echo 2 || echo 1)
echo "vLLM $VLLM_VERSION, $NGPU GPU(s): tensor parallel $TP"

MODEL_DIR=${MODEL_DIR:-assets/gemma3-27b-attn-tiny}
if [[ ! -f "$MODEL_DIR/config.json" ]]; then
  TOK=${TOKENIZER_FROM:-assets/SmolLM2-135M-Instruct}
  [[ -f "$TOK/tokenizer.json" ]] || { echo "error: no tokenizer in $TOK (set TOKENIZER_FROM)" >&2; exit 2; }
  if python3 run_e2e.py twin --help >/dev/null 2>&1; then
    # SmolLM2's tokenizer has 49152 tokens; with a Gemma tokenizer set TWIN_SET="" (Gemma vocab).
    python3 run_e2e.py twin --like gemma3-27b-attn-tiny --out "$MODEL_DIR" --tokenizer-from "$TOK" \
      ${TWIN_SET-"--set" "vocab_size=49152"}
  else
    LIKE=$(mktemp -d)/config.json
    # gemma-3-27b's attention: 32 q / 16 kv heads, head 128, window 1024, every 6th layer global,
    # query_pre_attn_scalar 168; 12 layers, hidden 1024, SmolLM2's vocabulary.
    python3 - "$LIKE" <<'EOF'
import json, sys
types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
json.dump({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1024,
           "intermediate_size": 4096, "num_hidden_layers": 12, "num_attention_heads": 32,
           "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024, "sliding_window_pattern": 6,
           "layer_types": types, "vocab_size": 49152, "max_position_embeddings": 32768,
           "query_pre_attn_scalar": 168, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": None,
           "final_logit_softcapping": None, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16"}, open(sys.argv[1], "w"), indent=1)
EOF
    python3 run_e2e.py assets random --like "$LIKE" --tokenizer-from "$TOK" --out "$MODEL_DIR"
  fi
fi

ROOT_OUT=${OUT:-results}
RUN_ID=${RUN_ID:-plugin-proof-$(date +%Y%m%d-%H%M%S)-tp$TP}
set +e
python3 run_e2e.py --config configs/h200-plugin-proof.toml --model "$MODEL_DIR" --tp "$TP" \
  --out "$ROOT_OUT" --run-id "$RUN_ID" --no-progress
RC=$?
set -e
echo "harness exit status $RC; run folder $ROOT_OUT/$RUN_ID"

python3 - "$ROOT_OUT/$RUN_ID" "$TP" <<'EOF'
"""Compact summary, then the checks the proof makes (PASS/FAIL per line)."""
import json, sys
from pathlib import Path
from e2e.rundir.routing import routing_summary

run, tp = Path(sys.argv[1]), int(sys.argv[2])
cells = {}
for line in (run / "cells.jsonl").read_text().splitlines():
    c = json.loads(line)
    cells[c["arm"]] = c
ok = True

def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'PASS' if cond else 'FAIL'}  {what}")

for arm, c in cells.items():
    print(f"\n== {arm}: status {c['status']}, decode {c.get('decode_ms_per_token')} ms/token, error {c.get('error')}")
    for line in routing_summary(c.get("routing") or {}):
        print(line)
print()
expect_impl = {"fa": "forward:FlashAttentionImpl", "triton": "forward:TritonAttentionImpl"}
for arm, c in cells.items():
    r = c.get("routing") or {}
    classes = r.get("layer_classes") or []
    workers = [p for p in r.get("processes", []) if p.get("runs_model")]
    check(c["status"] == "ok", f"{arm}: cell ok")
    check(sorted(p["rank"] for p in workers) == list(range(tp)), f"{arm}: records from ranks {list(range(tp))}")
    check(len(classes) == 2 and {c2["n_layers"] for c2 in classes} == {10, 2},
          f"{arm}: two layer classes (10 sliding, 2 global layers)")
    check(all(len(c2["processes"]) == tp for c2 in classes), f"{arm}: every layer class counted on every rank")
    if arm in expect_impl:
        check(all(c2["path"] == expect_impl[arm] for c2 in classes), f"{arm}: every layer class took {expect_impl[arm]}")
    else:
        check(all(c2["path"] == "triton_paged_attention_2d" for c2 in classes),
              f"{arm}: every layer class took kernel_paged_attention_2d")
        check(not any(c2["paths"].get("rocm_custom_op") for c2 in classes), f"{arm}: custom ROCm op never called")
        gate = r.get("gate") or []
        check(gate and all(g["answer"] is False for g in gate), f"{arm}: gate answered False ({sum(g['n'] for g in gate)} calls)")
        if arm == "rocm-widened":
            check(all("widened-gfx11-gate" in (p.get("patches_applied") or []) for p in r["processes"]),
                  f"{arm}: widened gate applied in all {len(r['processes'])} processes")
            check(workers and all((p.get("gate") or {}).get("impl") == "widened-gfx11-gate"
                      and (p.get("gate") or {}).get("module_imported") for p in workers),
                  f"{arm}: widened gate installed in every worker")
print("\nALL PASS" if ok else "\nSOME CHECKS FAILED")
sys.exit(0 if ok else 1)
EOF
