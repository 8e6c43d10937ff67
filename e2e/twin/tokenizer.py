"""Tokenizer files for a twin: packed small to carry to the GPU machine, installed into the twin, and
the Gemma 3 processor files the multimodal wrapper needs."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path
from typing import Any

from e2e.errors import UserError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def pack_tokenizer(src: Path, out: Path) -> Path:
    """A compact copy of a tokenizer to carry to the GPU machine: big files xz-compressed."""
    src, out = Path(src), Path(out)
    found = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    if "tokenizer.json" not in found and "tokenizer.model" not in found:
        raise UserError(f"--pack-tokenizer {src}: no tokenizer.json or tokenizer.model there")
    out.mkdir(parents=True, exist_ok=True)
    for f in found:
        data = (src / f).read_bytes()
        if len(data) > (1 << 20):
            (out / (f + ".xz")).write_bytes(lzma.compress(data, preset=9))
        else:
            (out / f).write_bytes(data)
    return out


def install_tokenizer(src: Path, dest: Path) -> list[str]:
    """Copy tokenizer files from a model folder or a pack_tokenizer folder (decompressing .xz)."""
    src = Path(src)
    if not src.is_dir():
        raise UserError(f"--tokenizer-from {src}: not a folder")
    got = []
    for f in TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, dest / f)
        elif (src / (f + ".xz")).is_file():
            (dest / f).write_bytes(lzma.decompress((src / (f + ".xz")).read_bytes()))
        else:
            continue
        got.append(f)
    if "tokenizer.json" not in got and "tokenizer.model" not in got:
        raise UserError(f"--tokenizer-from {src}: no tokenizer.json(.xz) or tokenizer.model there")
    return got


# The multimodal wrapper needs Gemma3Processor's files (google/gemma-3-27b-it's) and the image tokens;
# a text-only Gemma 3 tokenizer (gemma-3-270m's) lacks <image_soft_token>, which the wrapper puts at
# image_token_index 262144, just past the text vocabulary.
GEMMA3_PREPROCESSOR = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}


def add_gemma3_processor(folder: Path, config: dict[str, Any]) -> None:
    """Processor files and image special tokens for a Gemma3ForConditionalGeneration twin."""
    image_size = config["vision_config"]["image_size"]
    pre = {
        **GEMMA3_PREPROCESSOR,
        "image_seq_length": config["mm_tokens_per_image"],
        "size": {"height": image_size, "width": image_size},
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    (folder / "processor_config.json").write_text(
        json.dumps({"image_seq_length": config["mm_tokens_per_image"], "processor_class": "Gemma3Processor"}, indent=2)
        + "\n"
    )
    tj = folder / "tokenizer.json"
    if tj.is_file():
        tok = json.loads(tj.read_text())
        have = {t["content"] for t in tok["added_tokens"]}
        if "<image_soft_token>" not in have:
            tok["added_tokens"].append(
                {
                    "id": config["image_token_index"],
                    "content": "<image_soft_token>",
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            )
            tj.write_text(json.dumps(tok, ensure_ascii=False))
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        data = json.loads(tc.read_text())
        data.setdefault("extra_special_tokens", {}).update(GEMMA3_IMAGE_TOKENS)
        data.update(GEMMA3_IMAGE_TOKENS)
        tc.write_text(json.dumps(data, indent=2) + "\n")
