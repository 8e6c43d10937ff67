#!/usr/bin/env bash
# On the GPU machine, once per carried folder .gpu/cN (N = 0..3), in quick succession:
#   bash maintainers/gpu/stage.sh N
# Each folder holds one part of the vLLM 0.26.0 bundle (../shared/device/pN) and one piece of the
# SmolLM2 GGUF (98 MB: too big for one 64 MiB transfer); .gpu/c3 also holds gsm8k's test.jsonl.
# After the last part: vLLM installed, the project installed (entry points for the plugin), and
# assets/SmolLM2-135M-Instruct + assets/gsm8k/test.jsonl built by the project's own asset code.
set -euo pipefail
N=${1:?usage: stage.sh N}
D=.gpu/c$N
bash "$D/p$N/gpu-install.sh" "$D"
mkdir -p /tmp/e2e-gguf && cp "$D"/gguf.part* /tmp/e2e-gguf/
if [ "$N" = 3 ]; then
  source "$D/p3/gpu-env.sh"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
  mkdir -p assets/cache assets/gsm8k
  cat /tmp/e2e-gguf/gguf.part0 /tmp/e2e-gguf/gguf.part1 /tmp/e2e-gguf/gguf.part2 /tmp/e2e-gguf/gguf.part3 \
    > assets/cache/SmolLM2-135M-Instruct.gguf
  cp "$D/gsm8k/test.jsonl" assets/gsm8k/test.jsonl
  python3 run_e2e.py assets smollm2 2>&1 | tail -1      # checks the GGUF's pinned sha256, converts
  python3 run_e2e.py assets gsm8k                        # checks test.jsonl's pinned sha256
fi
