"""The flags the harness itself passes to every `vllm serve` (e2e/serve/server.py ServerSpec.argv),
and which of them a config argument would set: the schema refuses such an argument unless
server.allow_harness_flag_overrides (e2e/design/schema.py)."""

from __future__ import annotations

# A config arg setting one of these would win (vLLM's parser takes the last value): --host 0.0.0.0
# exposes the server, --enable-prefix-caching breaks the measurement.
HARNESS_FLAGS = (
    "--host",
    "--port",
    "--api-key",
    "--served-model-name",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--generation-config",
    "--model",
    "--tensor-parallel-size",
)
HARNESS_SHORT_FLAGS = {"-tp": "--tensor-parallel-size"}


def harness_flag(arg: str) -> str | None:
    """The harness-owned flag that `arg` sets, if any: --flag and --flag=value, underscores as
    dashes (vLLM accepts --api_key), and argparse's abbreviations (--hos)."""
    if arg.startswith("--") and len(arg) > 2:
        name = "--" + arg[2:].split("=", 1)[0].replace("_", "-")
        if name in HARNESS_FLAGS:
            return name
        return next((f for f in HARNESS_FLAGS if f.startswith(name)), None)
    return next((long for f, long in HARNESS_SHORT_FLAGS.items() if arg.startswith(f)), None)
