"""Test patch whose target exists in the API server but not in workers: the start must still fail.

`tests.patches.missing_in_worker:install` does nothing in processes that are not vLLM workers, and in
a worker raises the way a real patch does when its target is absent in the running vLLM version.
This is how the tests prove that a failure inside a worker (not only in the API server) stops the
server start.
"""

from __future__ import annotations

import multiprocessing

TARGET = "vllm.v1.worker.cpu_model_runner.CPUModelRunner.e2e_no_such_method"


def install() -> None:
    if not multiprocessing.current_process().name.startswith("VllmWorker"):
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if not hasattr(CPUModelRunner, "e2e_no_such_method"):
        import vllm

        raise RuntimeError(f"target {TARGET} does not exist in vLLM {vllm.__version__}")
