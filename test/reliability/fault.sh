#!/usr/bin/env bash
# Fault injection for the CPU trainer (make fault; `make test` runs it). A tiny run of 72 steps with a checkpoint
# every 8 is run once without kills: the reference. Every run, the reference included, has the loss-spike guard on
# and one spike planted at step 67 (FLASHGPT2_FAULT=spike-loss:67, after the guard's 64-step window is full), so a
# resume must also restore the guard's window to skip the same update. Then each trial kills a fresh copy of the
# same run with
# SIGKILL at a seeded point, resumes it (or, when no checkpoint was complete yet, starts it again, as a user would),
# and compares the final model and state files with the reference's, byte for byte. The points:
#   - in a training step (FLASHGPT2_FAULT=kill-step:S, llmc/fault.h: after the backward, before the update);
#   - in the middle of a file write (kill-write:N: half of the N-th atomic write is in its .tmp, nothing renamed);
#   - by a timer from outside, at a seeded delay (wherever the run happens to be).
# Before a resume the final step's files are deleted if they exist, so the resumed run must write them itself:
# the comparison is never of a file with itself. Full-disk trials (enospc:N, in a checkpoint's writes) must
# exit 1 with one line naming the cause, leave the previous checkpoint the newest complete one and no temp file,
# and resume to the same bits.
# Prints its counts; exits 1 on any mismatch or broken expectation. FAULT_SEED and FAULT_TRIALS change the draw.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=./build/train_gpt2
seed=${FAULT_SEED:-1} trials=${FAULT_TRIALS:-12} report=${FAULT_REPORT:-}
[[ -x $bin ]] || { echo "error: $bin: build it first (make build/train_gpt2)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/fault_XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1  # one thread: the same bits on every run, and no thread contention on shared cores
export FLASHGPT2_FAULT=spike-loss:67
spike=$FLASHGPT2_FAULT
args=(--layers 1 --heads 2 --channels 16 -b 2 -t 16 -x 72 -n 8 -v 16 -m 2 -g 0 --spike-z 4)
final=00000072
t0=$SECONDS

"$bin" "${args[@]}" -o "$work/ref" > "$work/ref.out"
for f in model_$final.bin state_$final.bin; do [[ -s $work/ref/$f ]] || { echo "error: the reference run wrote no $f" >&2; exit 1; }; done
grep -q "^step 67 .* skipped lossz" "$work/ref/main.log" || { echo "error: the reference run did not skip the planted spike at step 67" >&2; exit 1; }

kills=0 kill_steps=0 kill_writes=0 kill_timer=0 early=0 resumes=0 restarts=0 mismatches=0 leftovers=0 broken=0
disk=0 disk_one_line=0 disk_kept=0 disk_same=0
fails=()

# Finishes the run in $1 the way a user would, then compares its final files with the reference's.
finish_and_compare() {
  local dir=$1 what=$2
  if [[ -e $dir/DONE_$final ]]; then  # the kill came after the last checkpoint: make the resume redo it
    rm -f "$dir/DONE_$final" "$dir/model_$final.bin" "$dir/model_$final.bin.crc32c" "$dir/state_$final.bin"
  fi
  local how=(--resume) log=$dir.resume.out
  if ls "$dir"/DONE_* >/dev/null 2>&1; then resumes=$((resumes + 1)); else how=() log=$dir.restart.out restarts=$((restarts + 1)); fi
  if ! "$bin" "${args[@]}" -o "$dir" "${how[@]+"${how[@]}"}" > "$log" 2>&1; then
    broken=$((broken + 1)); fails+=("$what: the ${how[0]:-fresh start} failed: $(tail -1 "$log")"); return
  fi
  if ! cmp -s "$dir/model_$final.bin" "$work/ref/model_$final.bin" || ! cmp -s "$dir/state_$final.bin" "$work/ref/state_$final.bin"; then
    mismatches=$((mismatches + 1)); fails+=("$what: final files differ from the uninterrupted run's")
  fi
  if compgen -G "$dir/*.tmp" >/dev/null; then leftovers=$((leftovers + 1)); fails+=("$what: temp files left: $(ls "$dir"/*.tmp)"); fi
}

RANDOM=$seed  # bash's generator, seeded: the same trials on every run
for t in $(seq 1 "$trials"); do
  dir=$work/t$t
  case $((t % 3)) in
    0) point=kill-step:$((RANDOM % 72)) ;;
    1) point=kill-write:$((1 + RANDOM % 37)) ;;  # write 1 is run_settings.txt, then 4 per checkpoint
    2) point=timer:$((200 + RANDOM % 2000)) ;;    # milliseconds
  esac
  status=0
  if [[ $point == timer:* ]]; then
    "$bin" "${args[@]}" -o "$dir" > "$dir.out" 2>&1 & pid=$!
    sleep "$(printf '%d.%03d' $((${point#timer:} / 1000)) $((${point#timer:} % 1000)))"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || status=$?
  else  # (in a subshell, whose bash reports the kill to /dev/null rather than to this script's stderr)
    (FLASHGPT2_FAULT=$spike,$point "$bin" "${args[@]}" -o "$dir" > "$dir.out" 2>&1; exit $?) 2>/dev/null || status=$?
  fi
  if [[ $status == 137 ]]; then
    kills=$((kills + 1))
    case $point in kill-step:*) kill_steps=$((kill_steps + 1)) ;; kill-write:*) kill_writes=$((kill_writes + 1)) ;; *) kill_timer=$((kill_timer + 1)) ;; esac
  elif [[ $point == timer:* && $status == 0 ]]; then
    early=$((early + 1))  # finished before the timer: still resumed and compared below
  else
    broken=$((broken + 1)); fails+=("trial $t ($point): exit status $status, expected death by SIGKILL (137)"); continue
  fi
  finish_and_compare "$dir" "trial $t ($point)"
done

# Full disk: the N-th write fails half way as ENOSPC would (writes 2.. are the checkpoints' files).
for n in 3 16 33; do
  dir=$work/disk$n
  disk=$((disk + 1))
  status=0
  FLASHGPT2_FAULT=$spike,enospc:$n "$bin" "${args[@]}" -o "$dir" > "$dir.out" 2> "$dir.err" || status=$?
  if [[ $status == 1 && $(wc -l < "$dir.err") == 1 ]] && grep -q "No space left on device" "$dir.err"; then
    disk_one_line=$((disk_one_line + 1))
  else
    fails+=("enospc:$n: exit $status, stderr: $(head -c 300 "$dir.err")")
  fi
  newest=$(ls "$dir" | sed -n 's/^DONE_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
  want=$(( ((n - 2) / 4) * 8 ))  # the checkpoint before the one whose write failed
  if [[ ${newest:-0} == "$want" ]] && ! compgen -G "$dir/*.tmp" >/dev/null && [[ ! -e $dir/model_$(printf %08d $((want + 8))).bin ]]; then
    disk_kept=$((disk_kept + 1))
  else
    fails+=("enospc:$n: newest complete checkpoint ${newest:-none}, expected $want, and no temp or half-made files: $(ls "$dir" | tr '\n' ' ')")
  fi
  before=$mismatches
  finish_and_compare "$dir" "enospc:$n"
  [[ $mismatches == "$before" ]] && disk_same=$((disk_same + 1))
done

summary="fault.sh: $trials trials (seed $seed, $((SECONDS - t0)) s) | kills $kills ($kill_steps in training steps, $kill_writes in file writes, $kill_timer by a timer; $early runs ended before their timer) | resumes $resumes, fresh restarts $restarts | mismatches $mismatches | leftover temp files $leftovers | unexpected exits $broken | full-disk runs $disk: one-line errors $disk_one_line, previous checkpoint kept $disk_kept, resumed to the same bits $disk_same"
for f in "${fails[@]+"${fails[@]}"}"; do echo "FAIL $f"; done
echo "$summary"
[[ -n $report ]] && echo "$summary" > "$report"
(( ${#fails[@]} == 0 ))
