#!/usr/bin/env bash
# Built CUDA extensions carried from one device call to the next, so that a call need not rebuild what the last one
# built (about 45 s of a gate's call on an H100). ninja decides by file times (its log's too), and the device's copy of
# the tree is written at each call's start, after any build: its sources are newer than an unpacked archive's outputs,
# and every extension is rebuilt. So where the archive was built from the C, C++ and CUDA sources this tree holds
# (their digest, written by `pack`), `unpack` dates those sources back to 2000, and ninja loads what it built; else it
# unpacks the archive as it was and ninja rebuilds what changed. (Other flags, compiler or torch change ninja's command
# lines: rebuilt too.)
#   FUSELAB_EXT_DIR=/tmp/fuselab-ext bash scripts/ext_cache.sh pack OUT.tgz
#   FUSELAB_EXT_DIR=/tmp/fuselab-ext bash scripts/ext_cache.sh unpack IN.tgz    (prints whether its builds were kept)
# SRC: the source tree the extensions are built from (default this tree's src/).
set -euo pipefail
EXT=${FUSELAB_EXT_DIR:?set FUSELAB_EXT_DIR}
SRC=${SRC:-"$(cd "$(dirname "$0")/.." && pwd)/src"}
STAMP=.sources.sha256

sources() {  # every C, C++ and CUDA file under SRC, NUL-separated, in one order, relative to SRC
  (cd "$SRC" && find . -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.c' -o -name '*.cpp' -o -name '*.h' \
    -o -name '*.hpp' \) -print0 | LC_ALL=C sort -z)
}
sources_digest() {  # one digest of their names and contents
  sources | (cd "$SRC" && xargs -0 -r sha256sum) | sha256sum | cut -d' ' -f1
}

case ${1:-} in
  pack)
    [ -d "$EXT" ] || { echo "no extensions in $EXT"; exit 0; }
    rm -f "$EXT/$STAMP"
    stale=0
    for dir in "$EXT"/*/; do  # stamped only if every build is up to date (a failed one may have left old outputs)
      if [ -f "$dir/build.ninja" ] && ! ninja -C "$dir" -n 2>/dev/null | grep -q "no work to do"; then
        echo "$dir: not up to date, so the archive is not stamped (the next call rebuilds)"; stale=1
      fi
    done
    [ "$stale" = 1 ] || sources_digest > "$EXT/$STAMP"
    tar czf "${2:?pack OUT.tgz}" -C "$(dirname "$EXT")" "$(basename "$EXT")"
    ;;
  unpack)
    [ -f "${2:?unpack IN.tgz}" ] || { echo "no archive $2: extensions will be built"; exit 0; }
    mkdir -p "$(dirname "$EXT")"
    tar xzf "$2" -C "$(dirname "$EXT")"
    if [ -f "$EXT/$STAMP" ] && [ "$(cat "$EXT/$STAMP")" = "$(sources_digest)" ]; then
      sources | (cd "$SRC" && xargs -0 -r touch -d 2000-01-01)
      echo "extensions unpacked from $2: built from these sources, kept"
    else
      echo "extensions unpacked from $2: built from other sources, ninja rebuilds what changed"
    fi
    ;;
  *) echo "usage: $0 pack OUT.tgz | unpack IN.tgz" >&2; exit 2 ;;
esac
