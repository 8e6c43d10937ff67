"""Excerpts of a vLLM release's source: the places the plugin and recorder depend on, verbatim.

vLLM releases that cannot be installed here (the GPU ones: 0.23.0, 0.26.0 pin torch 2.11, which no
index here has) are carried as one text file each in tests/data/vllm_excerpts/, made from the wheel
by this module; an installed vLLM is read the same way from its own files. A section is one
definition (a function whole, or a class header with one method's signature) or the model-runner
imports of one file, headed `### path:first-last name`.

    python -m tests.support.vllm_excerpts SITE VERSION 'WHEEL-NAME sha256'   # writes the release's file
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_excerpts"
ATTN_NEW = "vllm/model_executor/layers/attention/attention.py"
ATTN_OLD = "vllm/attention/layer.py"
# path -> names: "Class" (header only), "Class.method" (header + signature), "func" (signature),
# "func*" (whole), "imports" (the file's `from ...model_runner import` statements).
SPEC: dict[str, tuple[str, ...]] = {
    ATTN_NEW: ("Attention.__init__", "unified_attention_with_output*"),
    ATTN_OLD: ("Attention.__init__", "unified_attention_with_output*"),
    "vllm/v1/worker/gpu_model_runner.py": ("GPUModelRunner.execute_model",),
    "vllm/v1/worker/gpu/model_runner.py": ("GPUModelRunner.execute_model",),
    "vllm/v1/worker/cpu_model_runner.py": ("imports", "CPUModelRunner", "CPUModelRunner.execute_model"),
    "vllm/v1/worker/cpu/model_runner.py": ("imports", "CPUModelRunner", "CPUModelRunner.execute_model"),
    "vllm/v1/worker/mm_encoder_model_runner.py": (
        "imports",
        "MMEncoderModelRunner",
        "MMEncoderModelRunner.execute_model",
    ),
    "vllm/v1/worker/gpu_worker.py": ("imports",),
    "vllm/v1/worker/cpu_worker.py": ("imports",),
    "vllm/v1/attention/backends/flash_attn.py": ("FlashAttentionImpl.forward",),
    "vllm/v1/attention/backends/triton_attn.py": ("TritonAttentionImpl.forward",),
    "vllm/v1/attention/backends/rocm_attn.py": ("RocmAttentionImpl.forward",),
    "vllm/v1/attention/backends/cpu_attn.py": ("CPUAttentionBackendImpl.forward",),
    "vllm/_custom_ops.py": ("paged_attention_rocm",),
    "vllm/v1/attention/ops/chunked_prefill_paged_decode.py": (
        "kernel_paged_attention_2d",
        "chunked_prefill_paged_decode*",
    ),
    "vllm/platforms/rocm.py": ("use_rocm_custom_paged_attention*",),
}


def _start(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _header(lines: list[str], node: ast.AST) -> tuple[int, int]:
    """First and last line of a def/class up to its colon (decorators included)."""
    end = node.body[0].lineno - 1
    while end > node.lineno and not lines[end - 1].rstrip().endswith(":"):
        end -= 1  # comments or a blank line between the colon and the body
    return _start(node), end


def _find(tree: ast.Module, name: str) -> ast.AST | None:
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return n
    return None


def extract_file(path: str, text: str) -> list[tuple[str, str]]:
    """[(header, source)] of the SPEC sections present in one file."""
    lines = text.splitlines()
    tree = ast.parse(text)
    out = []

    def seg(a: int, b: int) -> str:
        return "\n".join(lines[a - 1 : b])

    for name in SPEC[path]:
        if name == "imports":
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("model_runner"):
                    out.append(
                        (f"{path}:{n.lineno}-{n.end_lineno} imports", textwrap.dedent(seg(n.lineno, n.end_lineno)))
                    )
            continue
        whole = name.endswith("*")
        cls_name, _, meth = name.rstrip("*").partition(".")
        node = _find(tree, cls_name)
        if node is None:
            continue
        if meth:
            m = next(
                (b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == meth),
                None,
            )
            if m is None:
                continue
            ca, cb = _header(lines, node)
            ma, mb = _header(lines, m)
            indent = " " * (m.col_offset + 4)
            out.append((f"{path}:{ma}-{mb} {name}", f"{seg(ca, cb)}\n{seg(ma, mb)}\n{indent}..."))
        elif whole:
            out.append((f"{path}:{_start(node)}-{node.end_lineno} {cls_name}", seg(_start(node), node.end_lineno)))
        else:
            a, b = _header(lines, node)
            out.append((f"{path}:{a}-{b} {cls_name}", f"{seg(a, b)}\n    ..."))
    return out


def extract(site: Path) -> dict[str, str]:
    """header -> source, for an installed or unpacked vLLM under `site`."""
    out = {}
    for path in SPEC:
        f = site / path
        if f.is_file():
            out.update(extract_file(path, f.read_text()))
    return out


def load(version: str) -> dict[str, str]:
    """header -> source from a carried release file."""
    text = (DATA / f"vllm-{version}.txt").read_text()
    out = {}
    for block in text.split("\n### ")[1:]:
        head, _, src = block.partition("\n")
        out[head] = src.rstrip("\n")
    return out


def carried() -> list[str]:
    return sorted(p.name[len("vllm-") : -len(".txt")] for p in DATA.glob("vllm-*.txt"))


class Release:
    """One release's excerpts, looked up by file and name."""

    def __init__(self, version: str, sections: dict[str, str]):
        self.version = version
        self.sections = sections

    def get(self, path: str, name: str) -> str | None:
        for head, src in self.sections.items():
            p, _, rest = head.partition(":")
            if p == path and rest.split(" ", 1)[1] == name:
                return src
        return None

    def imports(self, path: str) -> list[ast.ImportFrom]:
        return [
            ast.parse(src).body[0]
            for head, src in self.sections.items()
            if head.partition(":")[0] == path and head.endswith(" imports")
        ]

    def has_file(self, path: str) -> bool:
        return any(h.partition(":")[0] == path for h in self.sections)


def main() -> None:
    site, version, wheel = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    sections = extract(site)
    head = [
        f"# vLLM {version}: the places tests/test_targets_releases.py checks, verbatim from {wheel}",
        "# (vLLM is Apache-2.0). Written by `python -m tests.support.vllm_excerpts`; a method is its class's",
        "# header and its own signature, `...` standing for the bodies left out.",
    ]
    body = [f"### {h}\n{s}\n" for h, s in sections.items()]
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"vllm-{version}.txt").write_text("\n".join(head) + "\n\n" + "\n".join(body))
    print(f"{len(sections)} sections -> {DATA / f'vllm-{version}.txt'}")


if __name__ == "__main__":
    main()
