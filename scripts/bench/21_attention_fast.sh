#!/usr/bin/env bash
# 21_attention_fast: the fast attention forward rungs 5 (tensor cores), 6 (pipelined), 7 (Hopper wgmma/TMA),
# 8 (ping-pong: rung 7 with turn-taking consumer warpgroups).
#   1.–2. each rung validated on edge shapes (T = 1, 2, 17, 65, 257, 1000; HS 64 and 128; the runner's list plus
#      the ones issue 4 names), then validated and timed on the acceptance shapes (64,12,1024,64), (4,12,4096,64);
#      before rung 7, a Hopper self-test: TMA + swizzle + both wgmma descriptor kinds + P from registers,
#      alone (localizes a rung 7 failure to its data path or to its pipeline)
#   2b. rung 8: the same checks plus HS 128 at T = 257 and the second acceptance shape, then both of its tiles
#      (FLASHGPT2_R8_TILE=0: 2 consumers, Br 128; =1: 3 consumers, Br 192) on odd T and both acceptance shapes
#   3. tile-shape sweeps (FLASHGPT2_R6_TILE, FLASHGPT2_R7_TILE), each variant validated before it is timed
#   4. SASS: HGMMA / HMMA / LDSM / local-memory (LDL/STL) counts per kernel; 5. ncu: one launch of rungs 6, 7, 8
# Everything runs under `timeout` (a deadlocked pipeline must not stall the session).
# Run time: about 3 minutes on an H200 (the CPU oracle of each validation dominates; ncu ~60 s).
# Writes: $OUT/21_summary.txt (timings and verdicts), $OUT/21_sass.txt, $OUT/21_ncu_r{6,7,8}.txt,
#         $OUT/21_ncu_pipes_r{7,8}.txt.
set -uo pipefail
OUT=${OUT:-log/bench}
mkdir -p "$OUT" build
R=./dev/attention/runner
[[ -x $R ]] || { echo "no $R: the build failed (see build.log)"; exit 1; }
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
t_start=$(date +%s)
fails=0

run() {  # run SECONDS command...: echo it, run it under a time limit, count failures
    local limit=$1
    shift
    echo "+ $*"
    timeout -k 5 "$limit" "$@"
    local rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "!! rc=$rc$([[ $rc -ge 124 ]] && echo ' (timed out: hung?)'): $*"
        fails=$((fails + 1))
    fi
}

exec > >(tee build/21_log.txt) 2>&1  # a copy of everything, for the summary at the end

check_rung() {  # edge shapes: the runner's list ((1,1,1), (1,2,2), (2,3,17), (1,2,65), (2,2,257), (1,1,1000)
                # at HS 64 and 128, then (8,12,1024,64) timed) and six heads at T = 1000; then the GPT-2
                # training shape, validated and timed
    run 90 $R fwd "$1"
    run 30 $R fwd "$1" 2 3 1000 64
    run 60 $R fwd "$1" 64 12 1024 64
}

echo "== 1. rungs 5 and 6: edge shapes, then the acceptance shapes (validated, then timed) =="
check_rung 5
check_rung 6
run 90 $R fwd 6 4 12 4096 64

echo "== 2. rung 7: the Hopper self-test first, then the same checks =="
if [[ -x build/hopper_ptx_selftest ]]; then   # built by `make cuda`
    run 30 ./build/hopper_ptx_selftest
else
    echo "!! build/hopper_ptx_selftest is missing: see build.log"
    fails=$((fails + 1))
fi
check_rung 7
run 90 $R fwd 7 4 12 4096 64

echo "== 2b. rung 8 (ping-pong): edge shapes, HS 128 at odd T, both acceptance shapes, both tiles =="
check_rung 8
run 30 $R fwd 8 1 2 257 128
run 90 $R fwd 8 4 12 4096 64
for t in 0 1; do
    run 30 env FLASHGPT2_R8_TILE=$t $R fwd 8 1 1 1 64
    run 30 env FLASHGPT2_R8_TILE=$t $R fwd 8 2 3 1000 64
    run 60 env FLASHGPT2_R8_TILE=$t $R fwd 8 64 12 1024 64
    run 90 env FLASHGPT2_R8_TILE=$t $R fwd 8 4 12 4096 64
done
run 60 $R fwd 8 16 16 2048 128

echo "== 3. tile sweeps (entry 0 / the T-based default ran above) =="
for t in 1 2; do
    run 30 env FLASHGPT2_R6_TILE=$t $R fwd 6 2 3 1000 64
    run 60 env FLASHGPT2_R6_TILE=$t $R fwd 6 64 12 1024 64
done
run 30 env FLASHGPT2_R6_TILE=1 $R fwd 6 1 2 257 128
run 30 env FLASHGPT2_R6_TILE=2 $R fwd 6 1 2 257 128
run 30 env FLASHGPT2_R7_TILE=1 $R fwd 7 2 3 1000 64
run 30 env FLASHGPT2_R7_TILE=1 $R fwd 7 1 1 1 64
run 60 env FLASHGPT2_R7_TILE=1 $R fwd 7 64 12 1024 64
run 90 env FLASHGPT2_R7_TILE=0 $R fwd 7 4 12 4096 64

echo "== 4. SASS of rungs 5-8 =="
if "$CUOBJDUMP" --dump-sass $R > build/runner.sass 2> "$OUT/21_sass_err.txt"; then
    {
        echo "totals in dev/attention/runner: HGMMA $(grep -c HGMMA build/runner.sass)  HMMA $(grep -c HMMA build/runner.sass)" \
             " LDSM $(grep -c LDSM build/runner.sass)  LDL $(grep -c -w LDL build/runner.sass)  STL $(grep -c -w STL build/runner.sass)"
        echo "per kernel of rungs 5-6 and llmc/attention/wgmma_forward.cuh (rungs 7-8; mangled names):"
        awk '/Function : /{name=$3}
             name ~ /ladder2r[56]|hopper_attention/ {
                 if ($0 ~ /HGMMA/) h[name]++; if ($0 ~ /HMMA/) m[name]++; if ($0 ~ /LDSM/) s[name]++
                 if ($0 ~ /[^A-Z]LDL[ .]/) ll[name]++; if ($0 ~ /[^A-Z]STL[ .]/) sl[name]++; if ($0 ~ /MUFU.EX2/) e[name]++
                 if ($0 ~ /UTMALDG/) t[name]++; if ($0 ~ /WARPGROUP.ARRIVE/) a[name]++; seen[name] = 1 }
             END { for (n in seen) printf "  HGMMA %4d HMMA %4d LDSM %3d LDL %2d STL %2d MUFU.EX2 %4d UTMALDG %2d WARPGROUP.ARRIVE %2d  %s\n",
                   h[n], m[n], s[n], ll[n], sl[n], e[n], t[n], a[n], n }' build/runner.sass
    } | tee "$OUT/21_sass.txt"
else
    echo "!! cuobjdump failed (see 21_sass_err.txt)"
fi

echo "== 5. ncu: one launch of rungs 6, 7 and 8 at (64,12,1024,64) =="
for v in 6 7 8; do
    case $v in
        6) kname=attention_forward_pipelined_kernel ;;
        7) kname=attention_forward_hopper_overlap_kernel ;;   # llmc/attention/wgmma_forward.cuh, rung 7's loop
        8) kname=attention_forward_hopper_pingpong_kernel ;;  # the same, rung 8's loop (the trainer's)
    esac
    timeout -k 5 150 "$NCU" --clock-control none -k "regex:$kname" -c 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section InstructionStats $R fwd $v 64 12 1024 64 > "$OUT/21_ncu_r$v.txt" 2>&1 ||
        echo "!! ncu on rung $v failed or is not permitted here (see 21_ncu_r$v.txt)"
done
# Rungs 7 vs 8: how busy the two units that must overlap are (tensor pipe, MUFU = "xu" pipe), and the
# instruction count (rung 8's softmax changes should lower it). A separate run: a metric name this ncu does
# not know only costs this file.
for v in 7 8; do
    kname=$([[ $v == 7 ]] && echo attention_forward_hopper_overlap_kernel || echo attention_forward_hopper_pingpong_kernel)
    timeout -k 5 90 "$NCU" --clock-control none -k "regex:$kname" -c 1 --metrics \
        sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum \
        $R fwd $v 64 12 1024 64 > "$OUT/21_ncu_pipes_r$v.txt" 2>&1 ||
        echo "!! ncu pipe metrics on rung $v failed (see 21_ncu_pipes_r$v.txt)"
done

echo "== summary =="
{
    echo "21_attention_fast on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u)"
    grep -E '^\+ |^  time |FAIL|^fwd [0-9]+:|^!! |^HS |selftest' build/21_log.txt
    echo "failed commands: $fails   run time: $(( $(date +%s) - t_start )) s"
} > "$OUT/21_summary.txt"
cat "$OUT/21_summary.txt"
exit $(( fails > 0 ))
