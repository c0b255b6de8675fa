#!/usr/bin/env bash
# The CPU trainer's behaviour on bad input and bad runs, end to end (`make test` runs it; doc/reliability.md):
#   -v 0 means no evaluation; a flag given twice, or a flag where a value should be, is refused;
#   an -o that cannot be written is a permission error before any step, and a run that fails before its first
#   step leaves no folder behind;
#   a fresh run refuses an -o holding another run's checkpoints unless --overwrite; a resume with other settings is
#   refused, naming each one;
#   a NaN training loss, gradient norm or val loss (FLASHGPT2_FAULT, llmc/fault.h) stops before the update with
#   one line naming the step and the quantity, exits 1, and the newest complete checkpoint stays the last good
#   one, from which the run resumes;
#   --spike-z skips the update of a planted loss spike and says so in the step line and the log.
# Prints "trainer.sh: N checks, F failed"; exits 1 when any check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=./build/train_gpt2
[[ -x $bin ]] || { echo "error: $bin: build it first (make build/train_gpt2)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/trainer_XXXXXX")
chmod 755 "$work"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
unset FLASHGPT2_FAULT
tiny=(--layers 1 --heads 2 --channels 16 -b 2 -t 16 -m 2 -g 0)
checks=0 failed=0 skipped=0

check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  checks=$((checks + 1))
  if ! "$@"; then failed=$((failed + 1)); echo "FAIL $what"; fi
}
# run OUT ERR args...: runs the trainer, stdout and stderr to files; returns its exit status
run() { local out=$1 err=$2; shift 2; local s=0; "$bin" "$@" > "$out" 2> "$err" || s=$?; return $s; }
one_line_saying() { [[ $(wc -l < "$1") == 1 ]] && grep -q -- "$2" "$1"; }
newest_done() { ls "$1" | sed -n 's/^DONE_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1; }

# -v 0: no evaluation at all
s=0; run "$work/v0.out" "$work/v0.err" "${tiny[@]}" -x 3 -v 0 -o "$work/v0" || s=$?
check "-v 0 runs" test $s = 0
check "-v 0 prints no val loss" bash -c "! grep -q 'val loss' '$work/v0.out'"

# flags: given twice; a flag where a value should be
s=0; run /dev/null "$work/twice.err" -x 3 -x 4 -o "$work/twice" || s=$?
check "a flag given twice is refused" bash -c "[[ $s == 1 ]] && grep -q -- '-x: given twice' '$work/twice.err'"
s=0; run /dev/null "$work/swallow.err" -o --resume || s=$?
check "-o --resume is refused, not an output dir named --resume" bash -c "[[ $s == 1 ]] && grep -q 'is a flag' '$work/swallow.err' && [[ ! -e ./--resume ]]"

# an -o that cannot be written: a permission error, before any step
mkdir -p "$work/locked" && chmod 555 "$work/locked"
as_user=()
if [[ $(id -u) == 0 ]]; then
  if command -v setpriv >/dev/null; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); else as_user=(skip); fi
fi
if [[ ${as_user[0]:-} == skip ]]; then
  skipped=$((skipped + 1)); echo "SKIPPED permission check: running as root without setpriv"
else
  s=0; "${as_user[@]}" "$bin" "${tiny[@]}" -x 3 -o "$work/locked/run" > "$work/perm.out" 2> "$work/perm.err" || s=$?
  check "an unwritable -o is a permission error" bash -c "[[ $s == 1 ]] && grep -q 'Permission denied' '$work/perm.err'"
  check "... reported before any training step" bash -c "! grep -q '^step' '$work/perm.out'"
fi

# a run that fails before its first step leaves no folder: the first write (run_settings.txt) fails, disk full
s=0; FLASHGPT2_FAULT=enospc:1 run /dev/null "$work/nofolder.err" "${tiny[@]}" -x 3 -o "$work/new/nested/run" || s=$?
check "a full disk at the start is one line" bash -c "$(declare -f one_line_saying); [[ $s == 1 ]] && one_line_saying '$work/nofolder.err' 'No space left on device'"
check "... and leaves no folder" test ! -e "$work/new"

# another run's checkpoints: refused, then --overwrite deletes them (and nothing else)
run /dev/null /dev/null "${tiny[@]}" -x 8 -n 4 -v 0 -o "$work/old"
echo "mine" > "$work/old/notes.txt"
s=0; run /dev/null "$work/refuse.err" "${tiny[@]}" -x 4 -n 4 -v 0 -o "$work/old" || s=$?
check "a fresh run refuses another run's checkpoints" bash -c "[[ $s == 1 ]] && grep -q 'already holds a run' '$work/refuse.err' && grep -q -- '--overwrite' '$work/refuse.err'"
s=0; run /dev/null /dev/null "${tiny[@]}" -x 4 -n 4 -v 0 -o "$work/old" --overwrite || s=$?
check "--overwrite starts afresh" test $s = 0
check "... deleting the old run's later checkpoints" test ! -e "$work/old/DONE_00000008" -a ! -e "$work/old/model_00000008.bin"
check "... and only them" grep -q mine "$work/old/notes.txt"

# a resume with other settings: refused, every difference named
s=0; run /dev/null "$work/diff.err" "${tiny[@]}" -x 5 -n 4 -v 0 -l 0.01 -o "$work/old" --resume || s=$?
check "a resume with other settings is refused, naming each" bash -c "[[ $s == 1 ]] && grep -q 'steps: 4 -> 5' '$work/diff.err' && grep -q 'lr: 0.00499999989 -> 0.00999999978' '$work/diff.err'"

# NaN: stops before the update, one line, exit 1, the last good checkpoint stays the newest; then resumes
for fault in nan-norm:6:"gradient norm" nan-loss:5:"training loss" nan-val:8:"validation loss"; do
  IFS=: read -r kind step quantity <<< "$fault"
  dir=$work/$kind
  s=0; FLASHGPT2_FAULT=$kind:$step run "$dir.out" "$dir.err" "${tiny[@]}" -x 12 -n 4 -v 4 -o "$dir" || s=$?
  check "$kind: exit 1 with one line naming step $step and the $quantity" bash -c "$(declare -f one_line_saying); [[ $s == 1 ]] && one_line_saying '$dir.err' 'step $step: the $quantity is NaN'"
  check "$kind: the newest complete checkpoint is step 4, none after" bash -c "[[ \$(ls '$dir' | sed -n 's/^DONE_0*\([0-9][0-9]*\)\$/\1/p' | sort -n | tail -1) == 4 ]] && [[ ! -e '$dir/model_00000008.bin' ]]"
  check "$kind: no step line after the bad one" bash -c "! grep -q '^step  *$((step + 2))/' '$dir.out'"
  s=0; run /dev/null "$dir.resume.err" "${tiny[@]}" -x 12 -n 4 -v 4 -o "$dir" --resume || s=$?
  check "$kind: the run resumes from that checkpoint to the end" bash -c "[[ $s == 0 && -e '$dir/DONE_00000012' ]]"
done

# the loss-spike guard: a planted spike after the 64-step window is full is skipped and reported
s=0; FLASHGPT2_FAULT=spike-loss:70 run "$work/spike.out" /dev/null "${tiny[@]}" -x 72 -n -1 -v 0 --spike-z 4 -o "$work/spike" || s=$?
check "--spike-z: the run goes on (exit 0)" test $s = 0
check "--spike-z: the step line says the update was skipped" grep -q "^step   71/72 .*update skipped: loss z-score" "$work/spike.out"
check "--spike-z: the log says so" grep -q "^step 70 .* skipped lossz" "$work/spike/main.log"
check "--spike-z: only that step" test "$(grep -c skipped "$work/spike/main.log")" = 1

echo "trainer.sh: $checks checks, $failed failed, $skipped skipped"
(( failed == 0 ))
