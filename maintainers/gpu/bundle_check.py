#!/usr/bin/env python3
"""Check, without a GPU, that a GPU bundle's site has what `vllm serve` of a dense model imports.

    python3 maintainers/gpu/bundle_check.py SITE [--against OTHER-SITE]

Walks, through the source of the packages in WALKED, the module-level imports (not those under `if
TYPE_CHECKING`) from the modules a serving process loads (ROOTS: the CLI, the API server, the engine
core, the GPU worker and both model runners, the attention backends, the models the project serves),
and in the files of IN_FUNCTIONS also the imports inside functions, which run when those functions
are called (as get_quantization_config does for every quantised model). It names every import of a
module that is neither in SITE, nor on the GPU machine (bundle/machine.txt), nor in the standard
library. Imports inside `try:` that catch ImportError are reported apart, as guarded. It also checks
that the compiled libraries and engine files exist. `--against` runs the same walk over another site
(the 0.26.0 bundle, which served on an H200) and says which absences it shares.
Exit 1 if a required file is missing, or an unguarded import of an absent module that ALLOWED_ABSENT
does not name (with why this model never reaches it).
It cannot prove the bundle runs (no torch 2.11 here): only that nothing it needs was left out.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Packages whose own imports are followed: vLLM, and what the bundle carries because vLLM imports it
# unguarded on the serving path (humming: 0.23.0's get_quantization_config imports it on CUDA).
WALKED = ("vllm", "humming")
ROOTS = (
    "vllm",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.platforms.cuda",
    "vllm.platforms.rocm",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.rocm_attn",
    "vllm.v1.attention.ops.chunked_prefill_paged_decode",
    "vllm.model_executor.models.gemma3",
    "vllm.model_executor.models.gemma3_mm",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.model_executor.model_loader.gguf_loader",
    "vllm.v1.sample.sampler",
    "vllm.compilation.backends",
    "vllm.plugins",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
)
# Files whose functions run when a compressed-tensors W4A16 dense Gemma 3 is served on CUDA: every
# import in them is followed (an import in a function runs when it is called). Also roots.
IN_FUNCTIONS = (
    "vllm.config.model",  # ModelConfig: _verify_quantization and the rest
    "vllm.model_executor.layers.quantization",  # get_quantization_config: every method's module
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",  # scheme choice
    "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16",
    "vllm.model_executor.kernels.linear",  # choose_mp_linear_kernel
    "vllm.model_executor.kernels.linear.mixed_precision.machete",  # the W4A16 kernels on sm90
    "vllm.model_executor.kernels.linear.mixed_precision.marlin",
    "vllm.platforms.cuda",  # get_attn_backend_cls, device checks
    "vllm.v1.attention.selector",  # get_attn_backend
    "vllm.v1.attention.backends.registry",
    "vllm.v1.attention.backends.flash_attn",  # FLASH_ATTN / TRITON_ATTN / ROCM_ATTN
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.rocm_attn",
    "vllm.v1.worker.gpu_worker",  # init_device, load_model, profiling, warm-up
    "vllm.v1.worker.gpu_model_runner",  # the V1 runner (Gemma 3 runs it)
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.model_executor.models.gemma3",
    "vllm.model_executor.model_loader.default_loader",
)
# Absent modules that the walk reaches but a W4A16 dense Gemma 3 on one H200 never imports, each with
# why (read in the 0.23.0 source; the walk takes both arms of every `if`, and these sit behind one that
# is false there). A new absent module fails until it is added here, with its reason, or carried.
ALLOWED_ABSENT = {
    "flashinfer": "left out (bundle/drop.txt). The backend module is imported only by the sampler's "
    "is_flashinfer_available, after it returns on VLLM_USE_FLASHINFER_SAMPLER=0 (gpu-env.sh) "
    "(FLASH_ATTN is chosen on sm90); all2all imports it under has_flashinfer_nvlink_*() "
    "(MoE all-to-all; False without it); the all-reduce fusion under find_spec/try",
    "deep_ep": "fused_moe/all2all_utils imports the DeepEP modules under `if has_deep_ep():` (MoE "
    "expert parallelism; False when absent)",
    "mori": "fused_moe/all2all_utils, under `if has_mori():` (ROCm MoE all-to-all; False when absent)",
    "nixl_ep": "fused_moe/all2all_utils, under `if has_nixl_ep():` (MoE all-to-all; False when absent)",
    "vllm_xpu_kernels": "fa_utils imports vllm._xpu_ops under `elif current_platform.is_xpu():`",
    "torchao": "quantization/torchao.py imports it under `if torchao_version_at_least(...)`, which is "
    "False when find_spec('torchao') finds nothing",
    "modelscope": "imported under `if envs.VLLM_USE_MODELSCOPE:` (unset: models come from a local folder)",
}
REQUIRED_FILES = (
    "vllm/__init__.py",
    "vllm/_C.abi3.so",
    "vllm/_moe_C.abi3.so",
    "vllm/cumem_allocator.abi3.so",
    "vllm/vllm_flash_attn/__init__.py",
    "vllm/vllm_flash_attn/flash_attn_interface.py",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
    "vllm/v1/engine/core.py",
    "vllm/v1/engine/core_client.py",
    "vllm/v1/engine/async_llm.py",
    "vllm/v1/worker/gpu_worker.py",
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/entrypoints/cli/main.py",
)
# Distribution name -> import name, where they differ beyond '-' -> '_'.
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "pillow": "PIL",
    "opencv-python-headless": "cv2",
    "py-cpuinfo": "cpuinfo",
    "protobuf": "google",
    "nvidia-ml-py": "pynvml",
    "python-dateutil": "dateutil",
    "scikit-learn": "sklearn",
    "scikit-image": "skimage",
    "typing-extensions": "typing_extensions",
    "cuda-bindings": "cuda",
    "cuda-core": "cuda",
    "cuda-pathfinder": "cuda",
    "msgpack": "msgpack",
    "hf-xet": "hf_xet",
    "pytorch-lightning": "pytorch_lightning",
    "ml-dtypes": "ml_dtypes",
    "nvidia-cudnn-cu13": "nvidia",
    "nvidia-nccl-cu13": "nvidia",
    "nvidia-cublas": "nvidia",
}


@dataclass(frozen=True)
class Import:
    target: str  # absolute module name
    line: int
    guarded: bool  # inside a `try:` that catches ImportError (or broader)
    in_function: bool  # inside a def or lambda: runs only when called


@dataclass
class Absent:
    """An absent top-level module and where the walk met it ('module:line', 'in a function' when so)."""

    where: list[str]  # the unguarded sites once there is one, else the guarded ones
    guarded: bool = True
    first: str = ""  # the first unguarded importer (module), whose chain `--why` prints


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


@functools.cache
def file_imports(path: Path, mod: str) -> tuple[Import, ...]:
    """Every import statement of one file, anywhere in it except under `if TYPE_CHECKING:`."""
    out: list[Import] = []
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

    def add(node: ast.Import | ast.ImportFrom, guarded: bool, in_func: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, node.lineno, guarded, in_func) for a in node.names)
            return
        if node.level:
            base = pkg.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        out.append(Import(target, node.lineno, guarded, in_func))
        # `from pkg import submodule`: the submodule is imported too, if it is one.
        out.extend(Import(f"{target}.{a.name}", node.lineno, guarded, in_func) for a in node.names if a.name != "*")

    def visit(node: ast.AST, guarded: bool, in_func: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            add(node, guarded, in_func)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            g = guarded or _guarded(node.handlers)
            for s in node.body + node.orelse:
                visit(s, g, in_func)
            for s in node.handlers + node.finalbody:
                visit(s, guarded, in_func)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for s in node.orelse:  # the body is for type checkers only: it never runs
                visit(s, guarded, in_func)
        else:
            in_func = in_func or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, guarded, in_func)

    visit(ast.parse(path.read_text(), filename=str(path)), False, False)
    return tuple(out)


@dataclass
class Walk:
    absent: dict[str, Absent]  # absent top-level module -> where it was met
    parent: dict[str, str]  # module -> 'importer:line' that first reached it unguarded
    modules: int  # modules walked

    def chain(self, mod: str) -> list[str]:
        """How the walk reached mod: 'module:line' from mod back to a root."""
        out = []
        while mod in self.parent and len(out) < 40:
            out.append(self.parent[mod])
            mod = self.parent[mod].split(":")[0]
        return out


def walk(site: Path, roots=ROOTS, in_functions=IN_FUNCTIONS) -> Walk:
    """A module reached unguarded anywhere counts as unguarded; in a file of in_functions its
    functions' imports count too."""
    have = site_imports(site) | machine_imports() | set(sys.stdlib_module_names) | {"__future__"}
    absent: dict[str, Absent] = {}
    parent: dict[str, str] = {}
    done: set[tuple[str, bool]] = set()  # (module, guarded): walked unguarded covers guarded too
    todo = [(m, False, "") for m in (*roots, *in_functions)]
    while todo:
        mod, guarded, via = todo.pop()
        if (mod, guarded) in done or (mod, False) in done:
            continue
        done.add((mod, guarded))
        if via and not guarded:
            parent.setdefault(mod, via)
        path = module_file(site, mod)
        if path is None:
            continue
        deep = mod in in_functions
        for imp in file_imports(path, mod):
            if imp.in_function and not deep:
                continue
            top = imp.target.split(".")[0]
            g = guarded or imp.guarded
            if not top:
                continue
            here = f"{mod}:{imp.line}{' in a function' if imp.in_function else ''}"
            if top in WALKED:  # importing a.b.c runs a/__init__ and a/b/__init__ first
                parts = imp.target.split(".")
                todo.extend((".".join(parts[:i]), g, here) for i in range(1, len(parts) + 1))
            if top not in have:
                a = absent.setdefault(top, Absent([]))
                if a.guarded and not g:
                    a.guarded, a.first, a.where = False, mod, []
                if a.guarded == g:
                    a.where.append(here)
    return Walk(absent, parent, len({m for m, _ in done}))


def check(
    site: Path,
    against: Path | None = None,
    roots=ROOTS,
    in_functions=IN_FUNCTIONS,
    allowed=ALLOWED_ABSENT,
    required=REQUIRED_FILES,
) -> tuple[list[str], int]:
    """(report lines, problems)."""
    lines, bad = [], 0
    for f in required:
        if not (site / f).is_file():
            lines.append(f"MISSING file {f}")
            bad += 1
    for mod in (*roots, *in_functions):
        if module_file(site, mod) is None:
            lines.append(f"note: {mod} is not in this release")
    w = walk(site, roots, in_functions)
    other = walk(against, roots, in_functions).absent if against else {}
    for top, a in sorted(w.absent.items(), key=lambda kv: (kv[1].guarded, kv[0])):
        where = ", ".join(sorted(set(a.where))[:3])
        also = " (absent in --against too)" if top in other else ""
        if a.guarded:
            lines.append(f"guarded import {top} absent (in {where})")
        elif top in allowed:
            lines.append(f"allowed absent {top}: {allowed[top]} (in {where}){also}")
        else:
            lines.append(f"MISSING import {top} (in {where}){also}")
            bad += 1
    lines.append(
        f"{w.modules} modules walked from {len(set(roots) | set(in_functions))} roots "
        f"({len(in_functions)} with their functions' imports); {bad} problem(s)"
    )
    return lines, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path)
    ap.add_argument("--against", type=Path, help="another bundle's site, known to serve")
    ap.add_argument("--why", metavar="MODULE", help="print how the walk reaches an absent top-level MODULE")
    a = ap.parse_args()
    if a.why:
        w = walk(a.site)
        if a.why not in w.absent:
            print(f"{a.why} is not an absent import of {a.site}")
            return 1
        first = w.absent[a.why].first or w.absent[a.why].where[0].split(":")[0]
        print("\n".join([f"{a.why} imported by {first}", *(f"  <- {s}" for s in w.chain(first))]))
        return 0
    lines, bad = check(a.site, a.against)
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
