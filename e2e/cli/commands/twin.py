"""`twin`: build a random-weight shape twin of a model (e2e/twin/), or pack a tokenizer, or list the
built-in targets."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from e2e.cli.commands.base import Command
from e2e.cli.flags import parse_sets
from e2e.errors import UserError
from e2e.twin.build import build_twin
from e2e.twin.shards import DEFAULT_SHARD_GB
from e2e.twin.stamp import STAMP, check_replaceable, write_stamp
from e2e.twin.targets import BUILTINS
from e2e.twin.tokenizer import pack_tokenizer


class Twin(Command):
    name, help = "twin", "build a random-weight shape twin of a model"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--like", help=f"built-in ({', '.join(BUILTINS)}) or a config.json / model folder")
        p.add_argument("--out", type=Path, help="output folder (the twin, or the packed tokenizer)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--multimodal",
            action="store_true",
            help="built-ins: the Gemma3ForConditionalGeneration wrapper with its vision tower",
        )
        p.add_argument("--tokenizer-from", type=Path, help="folder with tokenizer files (plain or packed)")
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help="override a config field (num_hidden_layers=2, vision_config.num_hidden_layers=1)",
        )
        p.add_argument("--shard-gb", type=float, default=DEFAULT_SHARD_GB, help="shard size (default %(default)s)")
        p.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
        p.add_argument(
            "--pack-tokenizer",
            type=Path,
            metavar="SRC",
            help="instead of a twin: write a compact (xz) copy of SRC's tokenizer to --out",
        )
        p.add_argument("--list", action="store_true", help="list the built-in targets")

    def run(self, a: argparse.Namespace) -> int:
        if a.list:
            for name, b in BUILTINS.items():
                print(f"{name}: {b.description}")
            return 0
        if a.out is None:
            raise UserError("twin needs --out DIR")
        if a.pack_tokenizer:
            return self.pack(a.pack_tokenizer, a.out)
        if not a.like:
            raise UserError("twin needs --like NAME|CONFIG.json (see --list)")
        if a.shard_gb <= 0:
            raise UserError("--shard-gb must be positive")
        t0 = time.monotonic()
        sets = parse_sets(a.set)
        out = build_twin(a.like, a.out, a.seed, a.multimodal, a.tokenizer_from, sets, a.shard_gb, a.force)
        st = json.loads((out / STAMP).read_text())
        print(
            f"{out}: twin of {st['twin_of']}, seed {st['seed']}, {st['format']}, "
            f"{st['total_size'] / 1e9:.2f} GB in {len(st['shards'])} shard(s), "
            f"{time.monotonic() - t0:.1f} s"
        )
        return 0

    @staticmethod
    def pack(src: Path, out: Path) -> int:
        # It overwrites tokenizer files: only in a new or empty folder, or a pack it made before.
        check_replaceable(out, f"--out {out}")
        done = pack_tokenizer(src, out)
        write_stamp(done, "tokenizer-pack", {"packed_from": str(src)})
        size = sum(f.stat().st_size for f in done.iterdir() if f.name != STAMP)
        print(f"{done} ({size / 1e6:.1f} MB)")
        return 0
