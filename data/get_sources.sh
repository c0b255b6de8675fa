#!/usr/bin/env bash
# Finds (or downloads) the three source files `make data` tokenizes. Run from the repository root.
#
#   bash data/get_sources.sh dir            prints the source directory, choosing in this order:
#                                             1. $DATA_MIRROR, when set (it must hold the three files)
#                                             2. ../shared/data, when it holds all three
#                                             3. data/raw (git-ignored), filled by `fetch` below
#   bash data/get_sources.sh fetch DIR FILE  makes FILE (a path under DIR) exist: downloads it when DIR is
#                                             data/raw, else fails saying what is missing where
#
# Layout of a source directory:  tinyshakespeare/input.txt  gpt2/encoder.json  gpt2/vocab.bpe
# Downloads are checked against the SHA-256 below, so a changed or broken download is never tokenized.
set -euo pipefail

FILES=(tinyshakespeare/input.txt gpt2/encoder.json gpt2/vocab.bpe)

url_of() {
  case "$1" in
    tinyshakespeare/input.txt) echo https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt ;;
    gpt2/encoder.json) echo https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json ;;
    gpt2/vocab.bpe) echo https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe ;;
    *) return 1 ;;
  esac
}

sha_of() {
  case "$1" in
    tinyshakespeare/input.txt) echo 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed ;;
    gpt2/encoder.json) echo 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 ;;
    gpt2/vocab.bpe) echo 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 ;;
  esac
}

has_all() {
  local f
  for f in "${FILES[@]}"; do [[ -f "$1/$f" ]] || return 1; done
}

case "${1:-}" in
  dir)
    if [[ -n "${DATA_MIRROR:-}" ]]; then
      echo "${DATA_MIRROR%/}"
    elif has_all ../shared/data; then
      echo ../shared/data
    else
      echo data/raw
    fi
    ;;
  fetch)
    dir=${2:?usage: get_sources.sh fetch DIR FILE}
    file=${3:?usage: get_sources.sh fetch DIR FILE}
    rel=${file#"$dir"/}
    if [[ "$dir" != data/raw ]]; then
      echo "error: $file: no such file (the source directory $dir must hold ${FILES[*]})" >&2
      exit 1
    fi
    url=$(url_of "$rel") || { echo "error: $file: not a known source file" >&2; exit 1; }
    command -v curl >/dev/null || { echo "error: $file: missing, and curl is not installed to download it" >&2; exit 1; }
    mkdir -p "$(dirname "$file")"
    echo "downloading $url -> $file"
    if ! why=$(curl -fsSL --retry 3 -o "$file.tmp" "$url" 2>&1); then
      rm -f "$file.tmp"
      echo "error: $file: download from $url failed (${why##*$'\n'}); set DATA_MIRROR to a directory holding the sources" >&2
      exit 1
    fi
    got=$(sha256sum "$file.tmp" | cut -d' ' -f1)
    if [[ "$got" != "$(sha_of "$rel")" ]]; then
      rm -f "$file.tmp"
      echo "error: $file: downloaded file has SHA-256 $got, expected $(sha_of "$rel")" >&2
      exit 1
    fi
    mv "$file.tmp" "$file"
    ;;
  *)
    echo "usage: bash data/get_sources.sh dir | fetch DIR FILE" >&2
    exit 2
    ;;
esac
