#!/usr/bin/env python3
"""Slim a `pip --target` site for the GPU machine and write its content manifest.

    python3 maintainers/gpu/bundle_prune.py SITE PATTERNS-FILE MANIFEST

Removes the files matching PATTERNS-FILE (fnmatch patterns relative to SITE, `#` comments; each must
match at least one file, so a release that moved one is noticed, unless marked `?`) and drops them from the RECORD of
the distribution that lists them, so pip and importlib.metadata see a consistent install. Then writes
MANIFEST: one line `sha256  size  path` per file, sorted, which is what "the same bundle" means
whatever compressor packed it (make_bundle.sh prints its sha256).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import sys
from pathlib import Path

from bundle_lock import names  # the data files' one format (run from this folder, as a script)


def files(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file() or p.is_symlink())


def prune(site: Path, pats: list[str]) -> list[str]:
    present = files(site)
    gone = []
    for pat in pats:
        optional = pat.startswith("?")
        pat = pat.removeprefix("?")
        hit = [f for f in present if fnmatch.fnmatchcase(f, pat)]
        if not hit and not optional:
            sys.exit(f"bundle_prune: pattern {pat!r} matches nothing in {site}: check the release's layout")
        gone += hit
    for f in gone:
        (site / f).unlink()
    for d in sorted({p for f in gone for p in (site / f).parents if site in p.parents}, reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    removed = set(gone)
    for record in site.glob("*.dist-info/RECORD"):
        rows = list(csv.reader(io.StringIO(record.read_text())))
        kept = [r for r in rows if r and _site_path(site, r[0]) not in removed]
        if len(kept) != len(rows):
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(kept)
            record.write_text(buf.getvalue())
    return gone


def _site_path(site: Path, rec: str) -> str:
    # `pip --target` installs into a scratch prefix (lib/python + bin) and moves both into SITE, so
    # RECORD names console scripts from lib/python as ../../bin/x: that is SITE/bin/x.
    return rec[len("../../") :] if rec.startswith("../../bin/") else rec


def manifest(site: Path) -> str:
    lines = []
    for f in files(site):
        p = site / f
        data = p.read_bytes()
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {len(data)}  {f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    site, pats, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    gone = prune(site, names(pats))
    out.write_text(manifest(site))
    print(f"pruned {len(gone)} files from {site}; manifest {out}")


if __name__ == "__main__":
    main()
