#!/usr/bin/env bash
# Stage carried wheelhouse parts on a registry-less GPU host (one call per part fits the
# per-call transfer limit): copies PARTDIR/*.whl into $STAGE_DIR/<part-NN>/ (default
# /tmp/stage), checks their sha256 against the manifest, and says which parts are still missing.
#
#   bash deploy/stage.sh .wheelhouse/part-01 [.wheelhouse/part-02 ...]
#
# Parts of different wheelhouse builds are refused (their manifests differ): start over with
# `rm -rf /tmp/stage`. When every part is staged, run deploy/install.sh.
set -euo pipefail
STAGE="${STAGE_DIR:-/tmp/stage}"
die() { echo "stage.sh: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: stage.sh PARTDIR [PARTDIR ...] (a part-NN folder of a wheelhouse from deploy/wheelhouse.py)"
mkdir -p "$STAGE"
for part in "$@"; do
  part="${part%/}"
  [ -d "$part" ] || die "PARTDIR $part is not a directory (was it carried into this call?)"
  [ -f "$part/manifest.json" ] && [ -f "$part/install.sh" ] \
    || die "PARTDIR $part has no manifest.json/install.sh: not a part of a wheelhouse built by deploy/wheelhouse.py"
  name="$(basename "$part")"
  if [ -f "$STAGE/manifest.json" ] && ! cmp -s "$STAGE/manifest.json" "$part/manifest.json"; then
    die "$part belongs to another wheelhouse build than the parts already in $STAGE; rm -rf $STAGE and stage every part of one build"
  fi
  cp "$part/manifest.json" "$part/install.sh" "$STAGE/"
  mkdir -p "$STAGE/$name"
  shopt -s nullglob
  files=("$part"/*.whl "$part"/*.whl.piece-*)  # pieces: a wheel larger than a part, joined at install
  shopt -u nullglob
  [ ${#files[@]} -gt 0 ] || die "PARTDIR $part holds no wheels"
  cp "${files[@]}" "$STAGE/$name/"
  echo "stage.sh: copied ${#files[@]} file(s) of $name into $STAGE/$name"
  bash "$STAGE/install.sh" --verify-only --part "$name"
done
status="$(bash "$STAGE/install.sh" --status)"
echo "$status"
# last line: what is still missing (a caller reading only the tail still sees it)
missing="$(awk -F: '/: missing/ {printf "%s ", $1}' <<< "$status")"
if [ -n "$missing" ]; then
  echo "stage.sh: still missing: ${missing% }"
else
  echo "stage.sh: every part staged (next: deploy/install.sh)"
fi
