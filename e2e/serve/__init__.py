"""One vLLM server's life: what it runs (spec, env, compile cache), its start, health, logs and kill, retries on fresh servers, what may outlive a harness, pinned vLLM environments.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["attempts", "launch", "live_servers", "profiler_args", "server", "startup_phases", "venvs"]
