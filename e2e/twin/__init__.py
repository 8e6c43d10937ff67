"""Random-weight twins: checkpoints with a target's exact architecture and storage format.

Decode latency does not depend on weight values once the output length is fixed, so a twin with the
target's shapes, dtypes and quantization layout stands in for a model that cannot be fetched (for
latency only, never for accuracy). The twin is stamped (`twin_of`) so nothing mistakes it for the real
model.

    python run_e2e.py twin --like gemma-3-27b-it-w4a16 --out /tmp/twin --tokenizer-from DIR [--seed N]
    python run_e2e.py twin --like gemma-3-27b-it-w4a16 --multimodal --out ...   (the served wrapper)
    python run_e2e.py twin --like gemma3-27b-attn-tiny --out ...               (bf16, 12 layers)
    python run_e2e.py twin --like path/to/config.json --out ...                (any transformers arch)
    python run_e2e.py twin --pack-tokenizer assets/gemma-3-270m --out assets/tokenizers/gemma3

One module per stage: targets (what to build) -> tensors (which tensors) -> values (their bytes) ->
shards (safetensors files) -> build (the folder; tokenizer files from tokenizer, the stamp from stamp).
Its command line is e2e/cli/commands/twin.py; `run_e2e.py assets random` calls the same build_twin.
"""

from e2e.twin.build import build_twin
from e2e.twin.stamp import read_stamp

__all__ = ["build_twin", "read_stamp"]
