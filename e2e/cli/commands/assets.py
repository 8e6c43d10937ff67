"""`assets`: fetch and build the pinned models and data (e2e/assets.py), or a random-weight model
(`assets random`: the twin builder, e2e/twin/, under its older name)."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e.assets import DEFAULT_DIR, build_gsm8k, build_model
from e2e.cli.commands.base import Command
from e2e.cli.flags import parse_sets
from e2e.errors import UserError
from e2e.twin.build import build_twin


class Assets(Command):
    name, help = "assets", "fetch and build models and data"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("what", choices=("smollm2", "gemma3-270m", "gsm8k", "random", "all-cpu"))
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="assets root (default: %(default)s)")
        p.add_argument("--like", type=Path, help="random: config.json or model folder to copy the architecture from")
        p.add_argument("--tokenizer-from", type=Path, help="random: folder to copy tokenizer files from")
        p.add_argument("--out", type=Path, help="random: output folder")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help="random: override a config field (e.g. num_hidden_layers=2)",
        )

    def run(self, a: argparse.Namespace) -> int:
        root = a.dir
        if a.what in ("smollm2", "gemma3-270m"):
            print(build_model(a.what, root))
        elif a.what == "gsm8k":
            print(build_gsm8k(root))
        elif a.what == "all-cpu":
            print(build_model("smollm2", root))
            print(build_gsm8k(root))
        else:
            if not a.like or not a.out:
                raise UserError("assets random needs --like CONFIG.json and --out DIR")
            # The twin builder under its older name: one random-weight builder for every model.
            overrides = parse_sets(a.set)
            print(build_twin(str(a.like), a.out, a.seed, tokenizer_from=a.tokenizer_from, overrides=overrides))
        return 0
