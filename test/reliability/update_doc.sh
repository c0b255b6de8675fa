#!/usr/bin/env bash
# make reliability: runs the fuzzer and the two trainer scripts and writes their figures into doc/reliability.md,
# between its "reliability-figures" markers (scripts/readme_table.sh does the splice; the page is rewritten
# atomically and only when every run succeeded, so the figures on the page are always a passing run's).
# Usage: bash test/reliability/update_doc.sh "FUZZ COMMAND"   (the Makefile passes its FUZZ_RUN)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# == 1 ]] || { echo "usage: $0 'FUZZ COMMAND'" >&2; exit 2; }
out=$(mktemp -d "${TMPDIR:-/tmp}/reliability_XXXXXX")
trap 'rm -rf "$out"' EXIT
$1 --report "$out/fuzz.md" > "$out/fuzz.log"
bash test/reliability/trainer.sh | tail -1 > "$out/trainer.txt"
FAULT_REPORT="$out/fault.txt" bash test/reliability/fault.sh > "$out/fault.log"
{
  echo "Measured by \`make reliability\` on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- llmc test train_gpt2.cpp || echo ' (with uncommitted changes)'):"
  echo
  echo "Fuzzer (\`build/fuzz_cpu\`, AddressSanitizer + UndefinedBehaviorSanitizer):"
  echo
  sed '$d' "$out/fuzz.md"
  echo '```'
  tail -1 "$out/fuzz.md"
  cat "$out/trainer.txt" "$out/fault.txt"
  echo '```'
} > "$out/figures.md"
bash scripts/readme_table.sh "$out/figures.md" reliability-figures doc/reliability.md
