#!/usr/bin/env bash
# The GPU trainer's divergence policy, end to end (`make test-gpu` runs it after the test binaries): a NaN gradient
# norm planted at one step (FLASHGPT2_FAULT=nan-norm:S, llmc/fault.h) stops the run before that step's update with
# one line naming the step and the quantity and exit status 1; the newest complete checkpoint is then the one before
# it, its weights finite, and a resume from it (no fault) runs to the end. Also a NaN val loss, and a planted loss
# spike that --spike-z skips and names. Prints "divergence.sh: N checks, F failed"; exits 1 when any check fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-./build/train_gpt2cu_bf16}
[[ -x $bin ]] || { echo "error: $bin: build it first" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/divergence_XXXXXX"); trap 'rm -rf "$work"' EXIT
data=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
      --tokenizer data/gpt2_tokenizer.bin -b 2 -m 1 -s 0 --quiet)
small=("${data[@]}" -e d2 -t 256)
checks=0 failed=0
check() { local what=$1; shift; checks=$((checks + 1)); if ! "$@"; then failed=$((failed + 1)); echo "FAIL $what"; fi; }
newest_done() { ls "$1" | sed -n 's/^DONE_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1; }

# a NaN gradient norm at step 5 (checkpoints every 2 steps: 2 and 4 are complete)
s=0; FLASHGPT2_FAULT=nan-norm:5 "$bin" "${small[@]}" -x 8 -v 4 -n 2 -o "$work/nan" > "$work/nan.out" 2> "$work/nan.err" || s=$?
check "a NaN gradient norm exits 1" test $s = 1
check "one line naming the step and the quantity" bash -c "[[ \$(wc -l < '$work/nan.err') == 1 ]] && grep -q 'step 5: the gradient norm is NaN' '$work/nan.err'"
check "the newest complete checkpoint is step 4" test "$(newest_done "$work/nan")" = 4
check "no step-5 update reached main.log" bash -c "! grep -q '^step 5 ' '$work/nan/main.log'"
s=0; "$bin" "${small[@]}" -x 8 -v 4 -n 2 -o "$work/nan" --resume > "$work/resume.out" 2>&1 || s=$?
check "the resume from step 4 runs to the end" test $s = 0
check "the resumed run reached step 8" test -f "$work/nan/DONE_00000008"
# a NaN val loss at step 4: stopped, named
s=0; FLASHGPT2_FAULT=nan-val:4 "$bin" "${small[@]}" -x 6 -v 2 -n -1 -o "$work/val" > /dev/null 2> "$work/val.err" || s=$?
check "a NaN val loss exits 1 naming it" bash -c "test $s = 1 && grep -q 'step 4: the validation loss is NaN' '$work/val.err'"
# a planted spike at step 70 of a 72-step run: skipped and said so (the guard needs its 64-step window first)
s=0; FLASHGPT2_FAULT=spike-loss:70 "$bin" "${data[@]}" -e d1 -t 64 -x 72 -v 0 -n -1 --spike-z 6 -o "$work/spike" > /dev/null 2>&1 || s=$?
check "the spike run finishes" test $s = 0
check "main.log says step 70's update was skipped" grep -q '^step 70 .*skipped lossz' "$work/spike/main.log"
check "no other step was skipped" test "$(grep -c 'skipped lossz' "$work/spike/main.log")" = 1
echo "divergence.sh: $checks checks, $failed failed"
exit $(( failed > 0 ))
