#!/usr/bin/env bash
# Build the offline vLLM bundle for the GPU machine (torch 2.11.0+cu130, Python 3.12, no index) from
# PyPI, the way ../shared/device/ (vLLM 0.26.0) was made (../shared/notes/gpu-machine.md):
#   bash maintainers/gpu/make_bundle.sh VERSION OUTDIR        e.g.  0.23.0 .bundles/vllm-0.23.0
# 1. pip downloads exactly the wheels of maintainers/gpu/bundle/vllm-VERSION.lock (--require-hashes:
#    PyPI's sha256 of each; bundle_lock.py writes the lock);
# 2. installs them with `pip --target` (no deps, no bytecode) into a site folder;
# 3. prunes it (bundle/prune.txt: FA2, the Rust frontend, other Pythons' builds; RECORD edited);
# 4. packs it (tar sorted, fixed mtimes and owners; xz -9) and splits it into parts of PART_MIB
#    (34 MiB: one part plus a checkout fits one 64 MiB device call);
# 5. writes OUTDIR/p0..pN, each with its part, gpu-install.sh and gpu-env.sh, and OUTDIR/SHA256SUMS,
#    and compares them with this version's entry in maintainers/gpu/bundles.sha256 (RECORD=1 writes it).
# Wheels and the site stay in OUTDIR.build (a rerun reuses the wheels; delete it to free the disk). Then
# check the site's serve-time imports: python3 maintainers/gpu/bundle_check.py OUTDIR.build/site [--against S]
# Carry each OUTDIR/pN (34 MiB) in its own device call; on the machine: bash pN/gpu-install.sh DIR.
set -euo pipefail
VER=${1:?usage: make_bundle.sh VERSION OUTDIR}
OUT=${2:?usage: make_bundle.sh VERSION OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
LOCK=$HERE/bundle/vllm-$VER.lock
PART_MIB=${PART_MIB:-34}
[ -f "$LOCK" ] || { echo "make_bundle: no $LOCK (make it with: python3 $HERE/bundle_lock.py $VER)" >&2; exit 2; }
command -v xz >/dev/null && tar --version | grep -q GNU || { echo "make_bundle: needs GNU tar and xz" >&2; exit 2; }
PY=${PYTHON:-python3}
BUILD=$OUT.build
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_5 manylinux1; do PLAT+=(--platform "${p}_x86_64"); done

echo "== 1. wheels (hash-checked) -> $BUILD/wheels"
mkdir -p "$BUILD/wheels"
"$PY" -m pip download -q --no-deps --require-hashes "${PLAT[@]}" -d "$BUILD/wheels" -r "$LOCK"
# Exactly the lock's files: a stale wheel of another version would make the install ambiguous.
want=$(sed -n 's/.*  # \(.*\.whl\)$/\1/p' "$LOCK" | sort)
have=$(ls "$BUILD/wheels" | sort)
[ "$want" = "$have" ] || { echo "make_bundle: $BUILD/wheels differs from the lock:"; diff <(echo "$want") <(echo "$have"); exit 1; } >&2

echo "== 2. pip --target $BUILD/site"
rm -rf "$BUILD/site"
sed -n 's/^\([^# ][^ ]*==[^ ]*\) .*/\1/p' "$LOCK" > "$BUILD/requirements.txt"
# By name from a local folder (not by file path), so pip writes no direct_url.json naming this machine.
"$PY" -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --find-links "$BUILD/wheels" \
  --target "$BUILD/site" "${PLAT[@]}" -r "$BUILD/requirements.txt"

echo "== 3. prune"
"$PY" "$HERE/bundle_prune.py" "$BUILD/site" "$HERE/bundle/prune.txt" "$BUILD/manifest.txt"

echo "== 4. pack and split"
NAME=vllm-$VER-site.tar.xz
rm -rf "$OUT" && mkdir -p "$OUT"
tar -C "$BUILD/site" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf - . \
  | xz -9 -T2 > "$BUILD/$NAME"
WHOLE=$(sha256sum "$BUILD/$NAME" | cut -d' ' -f1)
rm -f "$BUILD/$NAME".part*
split -b "${PART_MIB}M" -d -a 1 "$BUILD/$NAME" "$BUILD/$NAME.part"
NPARTS=$(ls "$BUILD/$NAME".part* | wc -l)
[ "$NPARTS" -le 10 ] || { echo "make_bundle: $NPARTS parts (more than 10): raise PART_MIB" >&2; exit 1; }
PART_SUMS=""
for ((i = 0; i < NPARTS; i++)); do PART_SUMS+="$(sha256sum "$BUILD/$NAME.part$i" | cut -d' ' -f1) "; done

echo "== 5. $OUT/p0..p$((NPARTS - 1))"
render() { VER=$VER NPARTS=$NPARTS NAME=$NAME WHOLE=$WHOLE PART_SUMS=${PART_SUMS% } bash "$HERE/bundle_render.sh" "$1"; }
for ((i = 0; i < NPARTS; i++)); do
  mkdir -p "$OUT/p$i"
  mv "$BUILD/$NAME.part$i" "$OUT/p$i/"
  render "$HERE/bundle/gpu-install.sh.in" > "$OUT/p$i/gpu-install.sh"
  render "$HERE/bundle/gpu-env.sh.in" > "$OUT/p$i/gpu-env.sh"
  chmod +x "$OUT/p$i/gpu-install.sh"
done
rm -f "$BUILD/$NAME"
SITE_SUM=$(sha256sum "$BUILD/manifest.txt" | cut -d' ' -f1)
{
  echo "$WHOLE  $NAME"
  for ((i = 0; i < NPARTS; i++)); do (cd "$OUT" && sha256sum "p$i/$NAME.part$i"); done
  echo "$SITE_SUM  site-manifest ($(wc -l < "$BUILD/manifest.txt") files, $(du -sm "$BUILD/site" | cut -f1) MiB unpacked)"
} > "$OUT/SHA256SUMS"
cat "$OUT/SHA256SUMS"
du -b "$OUT"/p*/"$NAME".part* | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}'

# The committed record: the lines of this version between its header and the next.
REC=$HERE/bundles.sha256
entry() { echo "## vllm $VER (maintainers/gpu/make_bundle.sh $VER; lock $(sha256sum "$LOCK" | cut -c1-16))"; cat "$OUT/SHA256SUMS"; }
committed=$( [ -f "$REC" ] && awk -v h="## vllm $VER " 'index($0, h) == 1 {on = 1; print; next} /^## / {on = 0} on' "$REC" || true)
if [ "${RECORD:-0}" = 1 ]; then
  others=$( [ -f "$REC" ] && awk -v h="## vllm $VER " 'index($0, h) == 1 {on = 1; next} /^## / {on = 0} !on' "$REC" || true)
  { [ -n "$others" ] && echo "$others"; entry; } > "$REC"
  echo "recorded in $REC"
elif [ -z "$committed" ]; then
  echo "no entry for $VER in $REC (RECORD=1 writes one)"
elif [ "$committed" = "$(entry)" ]; then
  echo "same bytes as recorded in $REC"
elif [ "$(echo "$committed" | tail -1)" = "$(tail -1 "$OUT/SHA256SUMS")" ]; then
  echo "same site as recorded in $REC; archive bytes differ (another xz?)"
else
  echo "make_bundle: differs from $REC:" >&2; diff <(echo "$committed") <(entry) >&2; exit 1
fi
