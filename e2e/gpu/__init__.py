"""The GPU: its state per cell (NVML, the --gpu-exclusive policy), its measured read bandwidth, the roofline floor of a decode step.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["bandwidth", "gpu_driver", "gpu_state", "roofline"]
