#!/usr/bin/env bash
# Fill a bundle script template (maintainers/gpu/bundle/*.in) with one bundle's facts, from the environment:
#   VER NPARTS NAME WHOLE PART_SUMS (sha256 of each part, space-separated)  bundle_render.sh TEMPLATE
set -euo pipefail
: "${VER:?}" "${NPARTS:?}" "${NAME:?}" "${WHOLE:?}" "${PART_SUMS:?}"
sed -e "s|@VER@|$VER|g" -e "s|@NPARTS@|$NPARTS|g" -e "s|@WHOLE@|$WHOLE|g" -e "s|@PART_SUMS@|$PART_SUMS|g" \
    -e "s|@NAME@|$NAME|g" "${1:?usage: bundle_render.sh TEMPLATE}"
