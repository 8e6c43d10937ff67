"""Test patch: a known slowdown for the harness to find (the validation test's "B" arm).

`tests.patches.slow_decode:install` is a user patch (see e2e/plugin): the plugin calls it with no
arguments in every vLLM process. It wraps vLLM's CPU worker step,
`vllm.v1.worker.cpu_model_runner.CPUModelRunner.execute_model` (inherited from GPUModelRunner in
vLLM 0.32; wrapped on the CPU class only), so that every call sleeps E2E_TEST_DELAY_MS milliseconds
first when the call runs tokens. Only the worker calls it, once per decode step plus a constant
number of calls per request, which the long-minus-short differencing cancels: the expected effect is
+delay ms per token. Calls that run no token are not delayed: vLLM 0.32's engine core keeps a batch
queue and calls execute_model with an empty schedule when every request is already scheduled
(v1/engine/core.py, step_with_batch_queue); sleeping in those too made the validation see +38 to
+45 ms per token for a 30 ms delay (three runs of 2026-12-01).
Unset or 0: no delay (the patch still installs, so the arm proves the plugin path).
E2E_TEST_DELAY_AFTER_STEPS=N switches the delay on only after N calls that ran tokens in this process:
a step in the middle of a server's life, for the bookends to find (tests/server/test_bookends.py). The
patch prints "slow_decode: delay on from step N+1" to the server log when it does.
"""

from __future__ import annotations

import functools
import os
import time

TARGET = "vllm.v1.worker.cpu_model_runner.CPUModelRunner.execute_model"


def install() -> None:
    delay_ms = float(os.environ.get("E2E_TEST_DELAY_MS") or 0)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError as exc:  # a GPU build, or the module moved: the test must not pass silently
        raise RuntimeError(f"slow_decode: cannot import the patch target {TARGET}: {exc}") from exc
    original = getattr(CPUModelRunner, "execute_model", None)
    if original is None:
        raise RuntimeError(f"slow_decode: {TARGET} does not exist in this vLLM")
    if getattr(original, "_e2e_slow_decode", False):
        return  # installed already in this process
    delay_s = delay_ms / 1e3
    after = int(os.environ.get("E2E_TEST_DELAY_AFTER_STEPS") or 0)
    steps = [0]  # calls that ran tokens, in this process

    @functools.wraps(original)
    def execute_model(self, *args, **kwargs):
        sched = args[0] if args else kwargs.get("scheduler_output")
        if getattr(sched, "total_num_scheduled_tokens", 1) > 0:
            steps[0] += 1
            if delay_s > 0 and steps[0] > after:
                if steps[0] == after + 1 and after:
                    print(f"slow_decode: delay on from step {steps[0]}", flush=True)
                time.sleep(delay_s)
        return original(self, *args, **kwargs)

    execute_model._e2e_slow_decode = True  # type: ignore[attr-defined]
    CPUModelRunner.execute_model = execute_model
