"""The run folder as data: its formats and typed rows, the store (append, lock, resume), the manifest, code identity, routing records, the patches' call evidence (inert arms).

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = [
    "formats",
    "gpu_rows",
    "identity",
    "manifest",
    "manifest_model",
    "patch_evidence",
    "routing",
    "rows",
    "store",
]
