#!/usr/bin/env python3
"""Check, without a GPU, that a GPU bundle's site has what `vllm serve` of a dense model imports.

    python3 scripts/gpu/bundle_check.py SITE [--against OTHER-SITE]

Walks the module-level imports (not those inside functions, nor under `if TYPE_CHECKING`) from the
modules a serving process loads (ROOTS: the CLI, the API server, the engine core, the GPU worker and
both model runners, the attention backends, the models the project serves) through vLLM's own source,
and names every import of a package that is neither in SITE, nor on the GPU machine
(bundle/machine.txt), nor in the standard library. Imports inside `try:` that catch ImportError are
reported apart, as guarded. It also checks that the compiled libraries and engine files exist.
`--against` runs the same walk over another site (the 0.26.0 bundle, which served on an H200) and
marks what is missing in both: such an import is evidently not reached there either.
Exit 1 if a required file or an unguarded import is missing (and not missing in OTHER-SITE too).
It cannot prove the bundle runs (no torch 2.11 here): only that nothing it needs was left out.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOTS = (
    "vllm", "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core", "vllm.v1.engine.core_client", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner", "vllm.platforms.cuda", "vllm.platforms.rocm",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.rocm_attn", "vllm.v1.attention.ops.chunked_prefill_paged_decode",
    "vllm.model_executor.models.gemma3", "vllm.model_executor.models.gemma3_mm",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen3",
    "vllm.model_executor.model_loader.default_loader", "vllm.model_executor.model_loader.gguf_loader",
    "vllm.v1.sample.sampler", "vllm.compilation.backends", "vllm.plugins",
)
REQUIRED_FILES = (
    "vllm/__init__.py", "vllm/_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/cumem_allocator.abi3.so",
    "vllm/vllm_flash_attn/__init__.py", "vllm/vllm_flash_attn/flash_attn_interface.py",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/v1/engine/core.py", "vllm/v1/engine/core_client.py",
    "vllm/v1/engine/async_llm.py", "vllm/v1/worker/gpu_worker.py", "vllm/v1/worker/gpu_model_runner.py",
    "vllm/entrypoints/cli/main.py",
)
# Distribution name -> import name, where they differ beyond '-' -> '_'.
IMPORT_NAMES = {"pyyaml": "yaml", "pillow": "PIL", "opencv-python-headless": "cv2", "py-cpuinfo": "cpuinfo",
                "protobuf": "google", "nvidia-ml-py": "pynvml", "python-dateutil": "dateutil",
                "scikit-learn": "sklearn", "scikit-image": "skimage", "typing-extensions": "typing_extensions",
                "cuda-bindings": "cuda", "cuda-core": "cuda", "cuda-pathfinder": "cuda", "msgpack": "msgpack",
                "hf-xet": "hf_xet", "pytorch-lightning": "pytorch_lightning", "ml-dtypes": "ml_dtypes",
                "nvidia-cudnn-cu13": "nvidia", "nvidia-nccl-cu13": "nvidia", "nvidia-cublas": "nvidia"}


def machine_imports() -> set[str]:
    out = set()
    for line in (HERE / "bundle" / "machine.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip().split("==")[0].lower()
        if name:
            out.add(IMPORT_NAMES.get(name, re.sub(r"[-.]", "_", name)))
    return out


def site_imports(site: Path) -> set[str]:
    out = set()
    for p in site.iterdir():
        if p.is_dir() and not p.name.endswith((".dist-info", ".libs")):
            out.add(p.name)
        elif p.suffix in (".py", ".so"):
            out.add(p.name.split(".")[0])
    return out


def module_file(site: Path, mod: str) -> Path | None:
    base = site.joinpath(*mod.split("."))
    for cand in (base / "__init__.py", base.with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    names = set()
    for h in handlers:
        if h.type is None:
            return True
        for n in ast.walk(h.type):
            if isinstance(n, ast.Name):
                names.add(n.id)
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "OSError"})


def module_imports(path: Path, mod: str, is_pkg: bool) -> list[tuple[str, bool]]:
    """(absolute module name, guarded) for each module-level import of one file."""
    out: list[tuple[str, bool]] = []
    pkg = mod if is_pkg else mod.rpartition(".")[0]

    def visit(body: list[ast.stmt], guarded: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend((a.name, guarded) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                out.append((target, guarded))
                # `from pkg import submodule`: the submodule is imported too, if it is one.
                out.extend((f"{target}.{a.name}", guarded) for a in node.names if a.name != "*")
            elif isinstance(node, ast.Try):
                g = guarded or _guarded(node.handlers)
                visit(node.body, g)
                for h in node.handlers:
                    visit(h.body, guarded)
                visit(node.orelse, g)
                visit(node.finalbody, guarded)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" in test:
                    visit(node.orelse, guarded)
                    continue
                visit(node.body, guarded)
                visit(node.orelse, guarded)
            elif isinstance(node, (ast.With,)):
                visit(node.body, guarded)

    visit(ast.parse(path.read_text(), filename=str(path)).body, False)
    return out


def walk(site: Path) -> tuple[dict[str, list[str]], dict[str, list[str]], int]:
    """(unguarded missing top-level package -> importers, guarded ones -> importers, modules walked)."""
    have = site_imports(site) | machine_imports() | set(sys.stdlib_module_names) | {"__future__"}
    hard: dict[str, list[str]] = {}
    soft: dict[str, list[str]] = {}
    seen: set[str] = set()
    todo = [(m, False) for m in ROOTS]
    guarded_of: dict[str, bool] = {}
    while todo:
        mod, guarded = todo.pop()
        if mod in seen and (guarded or not guarded_of.get(mod, True)):
            continue
        seen.add(mod)
        guarded_of[mod] = guarded_of.get(mod, True) and guarded
        path = module_file(site, mod)
        if path is None:
            continue
        for target, g in module_imports(path, mod, path.name == "__init__.py"):
            top = target.split(".")[0]
            if not top:
                continue
            if top == "vllm":
                todo.append((target, guarded or g))
            elif top not in have:
                (soft if guarded or g else hard).setdefault(top, []).append(mod)
    return hard, soft, len(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path)
    ap.add_argument("--against", type=Path, help="another bundle's site, known to serve")
    a = ap.parse_args()
    bad = 0
    for f in REQUIRED_FILES:
        if not (a.site / f).is_file():
            print(f"MISSING file {f}")
            bad += 1
    for mod in ROOTS:
        if module_file(a.site, mod) is None:
            print(f"note: {mod} is not in this release")
    hard, soft, n = walk(a.site)
    other_hard = walk(a.against)[0] if a.against else {}
    for top, by in sorted(hard.items()):
        both = top in other_hard
        print(f"{'missing in both' if both else 'MISSING'} import {top} (module level in {', '.join(sorted(set(by))[:3])})")
        bad += not both
    for top, by in sorted(soft.items()):
        print(f"guarded import {top} absent (in {', '.join(sorted(set(by))[:2])})")
    print(f"{n} modules walked from {len(ROOTS)} roots; {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
