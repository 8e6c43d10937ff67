"""`kernels`: the kernel-level routing and error check (GPU), kernels_check's own command line
passed through whole (`python -m kernels_check` is the same)."""

from __future__ import annotations

from e2e.cli.commands.base import Command


class Kernels(Command):
    name, help = "kernels", "kernel-level routing and error check (GPU): python -m kernels_check --help"
    add_help = False

    def run_argv(self, argv: list[str]) -> int:
        from kernels_check.cli import main as kernels_main

        return kernels_main(argv)
