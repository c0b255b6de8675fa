#!/usr/bin/env bash
# Splice a generated markdown file into README.md between two marker lines, replacing what was there:
#   <!-- MARKER:begin -->
#   ...generated, replaced on every run...
#   <!-- MARKER:end -->
# Usage: bash scripts/readme_table.sh FILE MARKER [README]     (README defaults to README.md)
# e.g.   bash scripts/readme_table.sh doc/results/attention_forward.md attention-forward
# Fails with one clear line (and leaves README untouched) if FILE is missing or the markers are not there
# exactly once each, in order. README is rewritten via README.tmp + rename: never half-written.
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 FILE MARKER [README]" >&2; exit 2
fi
file=$1 marker=$2 readme=${3:-README.md}
begin="<!-- ${marker}:begin -->" end="<!-- ${marker}:end -->"
[[ -f "$file" ]] || { echo "error: $file: no such file" >&2; exit 1; }
[[ -f "$readme" ]] || { echo "error: $readme: no such file" >&2; exit 1; }
nb=$(grep -cxF -- "$begin" "$readme" || true)
ne=$(grep -cxF -- "$end" "$readme" || true)
if [[ "$nb" != 1 || "$ne" != 1 ]]; then
  echo "error: $readme: needs the lines '$begin' and '$end' once each (found $nb and $ne)" >&2; exit 1
fi
lb=$(grep -nxF -- "$begin" "$readme" | cut -d: -f1)
le=$(grep -nxF -- "$end" "$readme" | cut -d: -f1)
(( lb < le )) || { echo "error: $readme: '$end' comes before '$begin'" >&2; exit 1; }
{
  head -n "$lb" "$readme"
  cat "$file"
  tail -n +"$le" "$readme"
} > "$readme.tmp"
mv "$readme.tmp" "$readme"
echo "spliced $file into $readme between the $marker markers"
