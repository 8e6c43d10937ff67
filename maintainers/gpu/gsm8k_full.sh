#!/usr/bin/env bash
# gsm8k sign-off on the H200 (vLLM 0.26.0 + lm-eval 0.4.13 from the bundle), through the harness only.
#
#   bash maintainers/gpu/gsm8k_full.sh            (from the checkout root, after gpu-install.sh)
#
# SmolLM2-135M-Instruct over all 1319 questions (gsm8k chain-of-thought, 8 exemplars), three fresh
# servers one after another: arm `fa` (FLASH_ATTN), arm `triton` (TRITON_ATTN), and `fa` again (the
# A/A pair: the stack's own nondeterminism). lm-eval's local-completions at 256 concurrent requests;
# eager mode (no compile, no graph capture) so each server starts about 40 s sooner, both arms alike.
# Expect about 5 minutes: three starts of ~60 s plus ~30-60 s of evaluation each.
# SmolLM2-135M scores only a few percent on gsm8k: the path and the paired statistics are the proof,
# not the score.
#
# Needs (carried; the machine has no network):
#   assets/SmolLM2-135M-Instruct/   or assets/cache/SmolLM2-135M-Instruct.gguf (then built here)
#   assets/gsm8k/test.jsonl         (`python run_e2e.py assets gsm8k`; its sha256 is checked)
# Knobs: LIMIT=N (quick look), CONC=256, GEN=256 (max_gen_toks), GRAPHS=1 (CUDA graphs on).
# Writes results/<run-id>/ and, when the device tool's $OUT is set, $OUT/<run-id>.tar.gz plus copies
# of gsm8k/summary.json and gsm8k/gsm8k.md (its $OUT takes at most 8 files, 2 folders down).
set -euo pipefail
cd "$(dirname "$0")/../.."

for f in "${GPU_ENV:-}" shared/device/p3/gpu-env.sh shared/device/gpu-env.sh /work/shared/device/gpu-env.sh; do
  if [[ -n "$f" && -f "$f" ]]; then source "$f"; break; fi
done
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

VLLM_VERSION=$(python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1 || true)
if [[ -z "$VLLM_VERSION" ]]; then
  echo "error: vllm does not import: install the bundle (shared/device/*/gpu-install.sh) and source gpu-env.sh" >&2
  exit 2
fi
python3 -c 'import lm_eval' 2>/dev/null || { echo "error: lm_eval does not import (bundle p3/wheels)" >&2; exit 2; }
echo "vLLM $VLLM_VERSION; $(nvidia-smi -L 2>/dev/null | head -1)"

MODEL_DIR=assets/SmolLM2-135M-Instruct
[[ -f "$MODEL_DIR/config.json" ]] || python3 run_e2e.py assets smollm2        # offline from the carried GGUF
python3 run_e2e.py assets gsm8k >/dev/null                                      # verifies the carried file

RUN_ID=${RUN_ID:-gsm8k-h200-smollm2-$(date +%Y%m%d-%H%M%S)}
GRAPHS_TOML=$([[ "${GRAPHS:-0}" == 1 ]] && echo true || echo false)
CFG=$(mktemp --suffix=.toml)
cat > "$CFG" <<EOF
name = "h200-gsm8k-smollm2"
description = "gsm8k sign-off on one H200: SmolLM2-135M-Instruct, FLASH_ATTN vs TRITON_ATTN, A/A on FLASH_ATTN"

[model]
path = "$MODEL_DIR"
max_model_len = 2048           # 8-shot prompt (~900 tokens) + 256 generated

[server]
launcher = "cli"               # the bundle's vLLM starts with python3 -m vllm.entrypoints.cli.main serve
cuda_graphs = $GRAPHS_TOML
startup_timeout_s = 900
request_timeout_s = 600

[workload]
depths = [1024]                # unused here: gsm8k only

[run]
retries = 1

[[arms]]
name = "fa"
description = "FLASH_ATTN (FA3 on sm90)"
args = ["--attention-backend", "FLASH_ATTN"]

[[arms]]
name = "triton"
description = "TRITON_ATTN (triton_unified_attention)"
args = ["--attention-backend", "TRITON_ATTN"]

[gsm8k]
tasks = ["gsm8k_cot_offline"]
num_concurrent = ${CONC:-256}
max_gen_toks = ${GEN:-256}
max_accuracy_drop = 0.01
alpha = 0.05
EOF

CMD=(python3 run_e2e.py gsm8k)
T0=$(date +%s)
set +e
"${CMD[@]}" --config "$CFG" --arms fa,triton --aa fa --limit "${LIMIT:-0}" --out results --run-id "$RUN_ID"
RC=$?
set -e
echo "gsm8k exit status $RC (0 pass, 1 fail/incomplete) after $(( $(date +%s) - T0 )) s; run folder results/$RUN_ID"
[[ -f "results/$RUN_ID/gsm8k/gsm8k.md" ]] && cat "results/$RUN_ID/gsm8k/gsm8k.md" | head -25

if [[ -n "${OUT:-}" && -d "results/$RUN_ID" ]]; then
  tar -C results -czf "$OUT/$RUN_ID.tar.gz" "$RUN_ID"
  cp "results/$RUN_ID/gsm8k/summary.json" "$OUT/summary.json" 2>/dev/null || true
  cp "results/$RUN_ID/gsm8k/gsm8k.md" "$OUT/gsm8k.md" 2>/dev/null || true
  ls -la "$OUT"
fi
exit $RC
