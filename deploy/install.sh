#!/usr/bin/env bash
# Install everything staged by deploy/stage.sh into one target folder and put the fork
# on top, on a host with no package registry:
#   1. verify every wheel of every part in $STAGE_DIR (default /tmp/stage) against the manifest;
#   2. pip install --no-index --no-deps --target $SITE_DIR (default /tmp/site) the dependencies;
#   3. build the fork wheel from this repository against the staged upstream sglang wheel
#      (SGLANG_UPSTREAM_WHEEL=..., pip wheel --no-build-isolation) -- or, if the wheelhouse was
#      built with --fork-wheel, take that prebuilt fork wheel -- and install it into $SITE_DIR;
#   4. check that `import sglang` resolves to $SITE_DIR and print what to export.
#
#   bash deploy/install.sh [SITE_DIR]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGE="${STAGE_DIR:-/tmp/stage}"
SITE="${1:-${SITE_DIR:-/tmp/site}}"
PY="${PYTHON:-python3}"
export PYTHON="$PY" PIP_ROOT_USER_ACTION=ignore
die() { echo "deploy/install.sh: error: $*" >&2; exit 1; }

[ -f "$STAGE/install.sh" ] && [ -f "$STAGE/manifest.json" ] \
  || die "nothing staged in $STAGE: run deploy/stage.sh PARTDIR for every part first"
bash "$STAGE/install.sh" --verify-only   # every part present and intact before touching $SITE

if bash "$STAGE/install.sh" --has-role fork; then
  bash "$STAGE/install.sh" "$SITE"       # dependencies + the prebuilt fork wheel
else
  bash "$STAGE/install.sh" --deps-only "$SITE"
  upstream="$(bash "$STAGE/install.sh" --print-wheel upstream)"
  out="$STAGE/fork-wheel"
  rm -rf "$out"
  mkdir -p "$out"
  # The staged upstream wheel names the base to build on (sglang-<version>-cpXY-...).
  base="$(basename "$upstream" | cut -d- -f2)"
  echo "deploy/install.sh: building the fork wheel from $REPO on base $base against $(basename "$upstream")"
  start=$SECONDS
  (cd "$REPO" && SGLANG_SM120_BASE="$base" SGLANG_UPSTREAM_WHEEL="$upstream" "$PY" -m pip wheel . --no-deps --no-build-isolation \
      --no-index --disable-pip-version-check -w "$out") || die "building the fork wheel failed (see above)"
  shopt -s nullglob
  built=("$out"/sglang-*.whl)
  shopt -u nullglob
  [ ${#built[@]} -eq 1 ] || die "expected one sglang-*.whl in $out after the build, found ${#built[@]}"
  echo "deploy/install.sh: built $(basename "${built[0]}") in $((SECONDS - start)) s; installing into $SITE"
  rm -rf "$SITE"/sglang-*.dist-info   # an earlier upstream/fork install must not leave a second dist-info
  "$PY" -m pip install --no-index --no-deps --upgrade --disable-pip-version-check --quiet \
      --target "$SITE" "${built[0]}" || die "installing ${built[0]} into $SITE failed"
fi

# Run from / so the repository's own python/ folder cannot be what gets imported.
where="$(cd / && PYTHONPATH="$SITE" "$PY" -c 'import sglang, os; print(os.path.dirname(sglang.__file__))')" \
  || die "PYTHONPATH=$SITE python3 -c 'import sglang' failed after the install"
case "$where" in
  "$SITE"/*) ;;
  *) die "import sglang resolved to $where, not under $SITE (another sglang shadows it?)" ;;
esac
echo "deploy/install.sh: done; sglang imports from $where"
echo "export PYTHONPATH=$SITE"
echo "export PATH=$SITE/bin:\$PATH"
