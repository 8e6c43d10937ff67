"""Excerpts of a vLLM release's source: the places the plugin and recorder depend on, verbatim.

vLLM releases that cannot be installed here (the GPU ones: 0.23.0, 0.26.0 pin torch 2.11, which no
index here has) are carried as one text file each in tests/data/vllm_excerpts/, made from the wheel
by this module; an installed vLLM is read the same way from its own files. A section is one
definition (a function whole, or a class header with one method's signature or whole method), one
statement of a definition that holds a token (`name@token`), or the model-runner imports of one file,
headed `### path:first-last name`.

Two sets: SPEC (the recorder's and the plugin's places, tests/data/vllm_excerpts/) and ROCM_SPEC
(what picks a Gemma 3's attention backend on ROCm, tests/data/rocm_backend_excerpts/, read by
tests/unit/plugin/test_rocm_backends.py for every release 0.23.0 to 0.33.0).

    python -m tests.support.vllm_excerpts SITE VERSION 'WHEEL-NAME sha256' [rocm]   # writes the release's file
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_excerpts"
ROCM_DATA = DATA.parent / "rocm_backend_excerpts"
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
# What decides the backend of a Gemma 3's decoder layers on ROCm and whether it reaches the gate.
ROCM_SPEC: dict[str, tuple[str, ...]] = {
    "vllm/platforms/rocm.py": (
        "_get_backend_priorities*",
        "RocmPlatform.get_attn_backend_cls@Selected backend",
        "RocmPlatform.check_and_update_config@is_mm_prefix_lm",
        "use_rocm_custom_paged_attention*",
    ),
    "vllm/v1/worker/gpu_model_runner.py": ("GPUModelRunner.__init__@is_mm_prefix_lm",),
    "vllm/v1/attention/backend.py": ("AttentionBackend.validate_configuration@supports_mm_prefix",),
    "vllm/v1/attention/backends/rocm_attn.py": (
        "RocmAttentionBackend.supports_mm_prefix*",
        "RocmAttentionImpl.forward@chunked_prefill_paged_decode(",
    ),
    "vllm/v1/attention/backends/triton_attn.py": ("TritonAttentionBackend.supports_mm_prefix*",),
    "vllm/v1/attention/ops/chunked_prefill_paged_decode.py": (
        "chunked_prefill_paged_decode@use_rocm_custom_paged_attention",
    ),
    ATTN_NEW: ("Attention.__init__@get_current_vllm_config", "Attention.__init__@use_mm_prefix"),
    ATTN_OLD: ("Attention.__init__@get_current_vllm_config", "Attention.__init__@use_mm_prefix"),
    "vllm/model_executor/models/utils.py": ("init_vllm_registered_model@with_hf_config",),
    "vllm/model_executor/model_loader/utils.py": ("initialize_model@set_current_vllm_config",),
    "vllm/model_executor/models/gemma3_mm.py": ("Gemma3ForConditionalGeneration.__init__@text_config",),
    "vllm/config/vllm.py": ("VllmConfig.with_hf_config@get_model_arch_config",),
    "vllm/config/model.py": ("ModelConfig.get_model_arch_config*", "ModelConfig.is_mm_prefix_lm"),
    "vllm/transformers_utils/model_arch_config_convertor.py": ("ModelArchConfigConvertorBase.is_mm_prefix_lm*",),
    "vllm/config/multimodal.py": ("MultiModalConfig.get_limit_per_prompt@language_model_only",),
    "vllm/engine/arg_utils.py": (
        'EngineArgs.add_cli_args@"--language-model-only"',
        'EngineArgs.add_cli_args@"--attention-backend"',
    ),
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


def _statements(node: ast.AST, lines: list[str], token: str) -> list[tuple[int, int]]:
    """(first, last) line of the smallest statement inside `node` around each line holding `token`."""
    inner = [n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node]
    spans = set()
    for no in range(node.lineno, node.end_lineno + 1):
        if token in lines[no - 1]:
            around = [n for n in inner if n.lineno <= no <= n.end_lineno]
            if around:
                best = min(around, key=lambda n: n.end_lineno - n.lineno)
                spans.add((_start(best), best.end_lineno))
    return sorted(spans)


def extract_file(path: str, text: str, spec: dict[str, tuple[str, ...]] | None = None) -> list[tuple[str, str]]:
    """[(header, source)] of the sections of `spec` (SPEC) present in one file."""
    lines = text.splitlines()
    tree = ast.parse(text)
    out = []

    def seg(a: int, b: int) -> str:
        return "\n".join(lines[a - 1 : b])

    for name in (spec or SPEC)[path]:
        if name == "imports":
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("model_runner"):
                    out.append(
                        (f"{path}:{n.lineno}-{n.end_lineno} imports", textwrap.dedent(seg(n.lineno, n.end_lineno)))
                    )
            continue
        name, _, token = name.partition("@")
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
            if token:
                for a, b in _statements(m, lines, token):
                    out.append((f"{path}:{a}-{b} {name}@{token}", textwrap.dedent(seg(a, b))))
            elif whole:
                out.append(
                    (
                        f"{path}:{_start(m)}-{m.end_lineno} {cls_name}.{meth}",
                        f"{seg(ca, cb)}\n{seg(_start(m), m.end_lineno)}",
                    )
                )
            else:
                out.append((f"{path}:{ma}-{mb} {name}", f"{seg(ca, cb)}\n{seg(ma, mb)}\n{indent}..."))
        elif token:
            for a, b in _statements(node, lines, token):
                out.append((f"{path}:{a}-{b} {name}@{token}", textwrap.dedent(seg(a, b))))
        elif whole:
            out.append((f"{path}:{_start(node)}-{node.end_lineno} {cls_name}", seg(_start(node), node.end_lineno)))
        else:
            a, b = _header(lines, node)
            out.append((f"{path}:{a}-{b} {cls_name}", f"{seg(a, b)}\n    ..."))
    return out


def extract(site: Path, spec: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """header -> source, for an installed or unpacked vLLM under `site`."""
    out = {}
    for path in spec or SPEC:
        f = site / path
        if f.is_file():
            out.update(extract_file(path, f.read_text(), spec))
    return out


def load(version: str, data: Path = DATA) -> dict[str, str]:
    """header -> source from a carried release file."""
    text = (data / f"vllm-{version}.txt").read_text()
    out = {}
    for block in text.split("\n### ")[1:]:
        head, _, src = block.partition("\n")
        out[head] = src.rstrip("\n")
    return out


def carried(data: Path = DATA) -> list[str]:
    return sorted(
        (p.name[len("vllm-") : -len(".txt")] for p in data.glob("vllm-*.txt")),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )


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

    def all(self, path: str, name: str) -> list[str]:
        """Every section of `path` named `name` (a `name@token` has one per statement)."""
        return [
            src
            for head, src in self.sections.items()
            if head.partition(":")[0] == path and head.partition(":")[2].split(" ", 1)[1] == name
        ]

    def has_file(self, path: str) -> bool:
        return any(h.partition(":")[0] == path for h in self.sections)


def main() -> None:
    site, version, wheel = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    rocm = sys.argv[4:] == ["rocm"]
    spec, data = (ROCM_SPEC, ROCM_DATA) if rocm else (SPEC, DATA)
    sections = extract(site, spec)
    test = "tests/unit/plugin/test_rocm_backends.py" if rocm else "tests/unit/plugin/test_targets_releases.py"
    head = [
        f"# vLLM {version}: the places {test} checks, verbatim from {wheel}",
        "# (vLLM is Apache-2.0). Written by `python -m tests.support.vllm_excerpts`; a method is its class's",
        "# header and its own signature, `...` standing for the bodies left out; `name@token` is one",
        "# statement of that definition holding the token, dedented.",
    ]
    body = [f"### {h}\n{s}\n" for h, s in sections.items()]
    data.mkdir(parents=True, exist_ok=True)
    (data / f"vllm-{version}.txt").write_text("\n".join(head) + "\n\n" + "\n".join(body))
    print(f"{len(sections)} sections -> {data / f'vllm-{version}.txt'}")


if __name__ == "__main__":
    main()
