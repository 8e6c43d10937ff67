#!/usr/bin/env bash
# Build the random-weight shape twin of gemma-3-27b-it-w4a16 on the GPU machine, into /tmp (never
# into the checkout, which travels back), timed, with its sizes printed.
#
#   bash maintainers/gpu/build_twin.sh                 text stack (Gemma3ForCausalLM), what the h200 configs serve
#   MULTIMODAL=1 bash maintainers/gpu/build_twin.sh    the Gemma3ForConditionalGeneration wrapper (+ vision tower)
#
# 16.0 GB (text) / 16.9 GB (multimodal) in four ~4.5 GB safetensors shards, written one thread per shard;
# about a minute on the H200 host (disk-bound; no GPU used: numpy's PCG64 makes the bytes identical on
# every machine, so the stamp's shard digests can be compared with a build made elsewhere).
# A folder whose stamp matches (same target, seed, config) is kept, so a warm machine rebuilds nothing.
#
# Needs (carried; the machine has no network): the Gemma 3 tokenizer in compact form,
#   assets/tokenizers/gemma3/   made on the CPU machine with
#     python run_e2e.py assets gemma3-270m
#     python run_e2e.py twin --pack-tokenizer assets/gemma-3-270m --out assets/tokenizers/gemma3   (3.5 MB)
# and carry = ["assets/tokenizers"]. Knobs: SEED (0), TWINS_DIR (/tmp/twins), TOKENIZER_FROM.
set -euo pipefail
cd "$(dirname "$0")/../.."

for f in "${GPU_ENV:-}" shared/device/gpu-env.sh shared/device/p3/gpu-env.sh /work/shared/device/gpu-env.sh; do
  if [[ -n "$f" && -f "$f" ]]; then source "$f"; break; fi
done

SEED=${SEED:-0}
TWINS_DIR=${TWINS_DIR:-/tmp/twins}
NAME=gemma-3-27b-it-w4a16
TWIN=$TWINS_DIR/$NAME
MM=()
if [[ "${MULTIMODAL:-0}" == 1 ]]; then TWIN=$TWIN-mm; MM=(--multimodal); fi
TOK=${TOKENIZER_FROM:-}
if [[ -z "$TOK" ]]; then
  for d in assets/tokenizers/gemma3 assets/gemma-3-270m; do
    if [[ -f "$d/tokenizer.json.xz" || -f "$d/tokenizer.json" ]]; then TOK=$d; break; fi
  done
fi
if [[ -z "$TOK" ]]; then
  echo "error: no Gemma tokenizer: carry assets/tokenizers/gemma3 (see the header of $0)" >&2
  exit 2
fi
mkdir -p "$TWINS_DIR"
echo "disk before: $(df -h --output=avail "$TWINS_DIR" | tail -1 | tr -d ' ') free in $TWINS_DIR; $(nproc) cores"

T0=$(date +%s.%N)
python3 run_e2e.py twin --like "$NAME" "${MM[@]}" --out "$TWIN" --seed "$SEED" --tokenizer-from "$TOK"
T1=$(date +%s.%N)
python3 -c "print(f'build wall time: {$T1 - $T0:.1f} s')"

ls -l "$TWIN"
du -sh "$TWIN"
python3 - "$TWIN" <<'PY'
import json, sys
from pathlib import Path
from safetensors import safe_open
d = Path(sys.argv[1])
st = json.loads((d / ".e2e-asset.json").read_text())
n = 0
for f in sorted(d.glob("*.safetensors")):
    with safe_open(str(f), "pt") as g:  # header check: every shard opens and lists its tensors
        n += len(list(g.keys()))
print(f"twin_of {st['twin_of']}, seed {st['seed']}, {st['format']}")
print(f"{n} tensors, {st['total_size'] / 1e9:.2f} GB, generation+write {st['build_s']} s")
for f, h in st["shards"].items():
    print(f"  {f} sha256 {h}")
PY
