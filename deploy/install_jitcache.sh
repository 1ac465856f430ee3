#!/usr/bin/env bash
# Put a cache made by deploy/prebuild_jit.py where a GPU host looks for it:
#   * sglang's tvm-ffi JIT modules (Marlin) -> $JIT_DIR (default /tmp/jitcache);
#     export TVM_FFI_CACHE_DIR=$JIT_DIR before starting sglang;
#   * FlashInfer modules (CACHE/flashinfer-aot, from --flashinfer) -> SITE/flashinfer/data/aot/,
#     where FlashInfer loads a module without compiling it (JitSpec.is_aot). Refused when the
#     cache was built for another FlashInfer version than the one installed in SITE.
#
#   bash deploy/install_jitcache.sh CACHE [SITE_DIR]
set -euo pipefail
die() { echo "install_jitcache.sh: error: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: install_jitcache.sh CACHE [SITE_DIR] (CACHE: the --out folder of prebuild_jit.py)"
CACHE="${1%/}"
SITE="${2:-${SITE_DIR:-/tmp/site}}"
JIT_DIR="${JIT_DIR:-/tmp/jitcache}"
PY="${PYTHON:-python3}"
[ -d "$CACHE" ] || die "$CACHE is not a directory (was it carried into this call?)"

mkdir -p "$JIT_DIR"
find "$CACHE" -mindepth 1 -maxdepth 1 ! -name flashinfer-aot -exec cp -r {} "$JIT_DIR/" \;
echo "install_jitcache.sh: sglang JIT modules in $JIT_DIR (export TVM_FFI_CACHE_DIR=$JIT_DIR)"

AOT="$CACHE/flashinfer-aot"
if [ -f "$AOT/manifest.json" ]; then
  want="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["flashinfer"])' "$AOT/manifest.json")"
  have="$(cd / && PYTHONPATH="$SITE" "$PY" -c 'import flashinfer; print(flashinfer.__version__)')" \
    || die "cannot import flashinfer from $SITE (run deploy/install.sh first)"
  [ "$want" = "$have" ] || die "$AOT was built for flashinfer $want, $SITE has $have: rebuild it with prebuild_jit.py --flashinfer"
  dest="$SITE/flashinfer/data/aot"
  mkdir -p "$dest"
  n=0
  for d in "$AOT"/*/; do
    name="$(basename "$d")"
    [ -f "$d/$name.so" ] || continue
    rm -rf "${dest:?}/$name"
    cp -r "$d" "$dest/$name"
    n=$((n + 1))
  done
  echo "install_jitcache.sh: $n FlashInfer modules (flashinfer $have) in $dest"
fi
