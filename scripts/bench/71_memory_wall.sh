#!/usr/bin/env bash
# make memory-wall: this card's memory hierarchy measured, and naive and flash attention placed on its roofline
# (dev/memory_wall.cu says how each figure is measured). Writes under $OUT (default log/memory-wall):
#   1. with Nsight Compute (ncu on the PATH): each attention forward of `./build/memory_wall --list-shapes` run
#      once under `ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum`, the HBM bytes summed over the
#      forward's kernels                                  -> $OUT/ncu_<kernel>_<shape>.csv, $OUT/ncu_bytes.txt
#   2. ./build/memory_wall [--bytes $OUT/ncu_bytes.txt]   -> doc/results/memory_wall.{md,csv} (copied to $OUT),
#      $OUT/memory_wall.log; the page is spliced into doc/memory_wall.md between the memory-wall markers
# Builds nothing (make does). The exit status is non-zero if any step failed; a failed ncu run leaves that row
# with model bytes only.
set -uo pipefail
OUT=${OUT:-log/memory-wall}; mkdir -p "$OUT"
bin=./build/memory_wall
[[ -x $bin ]] || { echo "missing $bin: run 'make memory-wall' (or 'make build/memory_wall')"; exit 1; }
status=0

# The two metrics summed over every kernel of one ncu CSV (the forward's kernels; the flash engine's one-thread
# sm90a probe is left out), printed as "read write" in bytes. Fails unless every kernel has both.
sum_dram_bytes() {
  awk -F'","' '
    /^"ID"/ { for (i = 1; i <= NF; i++) { c = $i; gsub(/"/, "", c); col[c] = i } next }
    /^"/ && ("Metric Name" in col) {
      kernel = $col["Kernel Name"]; name = $col["Metric Name"]; v = $col["Metric Value"]; gsub(/[",]/, "", v)
      if (kernel ~ /sm90a_probe/) next
      if (name == "dram__bytes_read.sum") { rd += v; nr++ }
      if (name == "dram__bytes_write.sum") { wr += v; nw++ }
    }
    END { if (!nr || nr != nw) exit 1; printf "%.0f %.0f\n", rd, wr }' "$1"
}

echo "== 1. HBM bytes of each attention forward (Nsight Compute) =="
bytes=()
if command -v ncu > /dev/null; then
  : > "$OUT/ncu_bytes.txt"
  shapes=$($bin --list-shapes) || { echo "$bin --list-shapes failed"; exit 1; }
  for shape in $shapes; do
    for kernel in naive flash; do
      csv="$OUT/ncu_${kernel}_${shape//,/x}.csv"
      timeout 300 ncu --clock-control none --replay-mode application --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --print-units base "$bin" --once "$kernel" --shape "$shape" > "$csv" 2> "${csv%.csv}.err"; rc=$?
      if [[ $rc == 0 ]] && rw=$(sum_dram_bytes "$csv"); then
        echo "$kernel ${shape//,/ } $rw" >> "$OUT/ncu_bytes.txt"
        printf '  %-5s %-14s read + write bytes: %s\n' "$kernel" "$shape" "$rw"
      else
        why=$(grep -h '==ERROR==' "$csv" "${csv%.csv}.err" | tail -n 1)
        echo "  ncu failed for $kernel $shape (rc=$rc): ${why:-$(tail -n 1 "${csv%.csv}.err")}"; status=1
      fi
    done
  done
  [[ -s $OUT/ncu_bytes.txt ]] && bytes=(--bytes "$OUT/ncu_bytes.txt")
else
  echo "no ncu: analytic bytes only"
fi

echo "== 2. the hierarchy and the roofline =="
timeout 300 $bin "${bytes[@]}" --out doc/results/memory_wall.md --csv doc/results/memory_wall.csv \
  > "$OUT/memory_wall.log" 2>&1 || { echo "memory_wall failed (rc=$?):"; status=1; }
tail -n 12 "$OUT/memory_wall.log"
if grep -qx 'wrote doc/results/memory_wall.md' "$OUT/memory_wall.log"; then  # this run's page, not an older one
  cp doc/results/memory_wall.md doc/results/memory_wall.csv "$OUT/"  # a copy with the logs (scripts/lent_gpu.sh)
  bash scripts/readme_table.sh doc/results/memory_wall.md memory-wall doc/memory_wall.md || status=1
fi
exit $status
