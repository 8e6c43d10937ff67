"""vllm-e2e-bench: does an arm make vLLM decode faster or slower, and does it keep accuracy?

Data flow: config -> plan -> cells (server + measurement) -> rows on disk -> analysis -> report.
Keep this file import-free: the plugin subpackage is imported inside every vLLM process.
"""

__version__ = "0.1.0"
