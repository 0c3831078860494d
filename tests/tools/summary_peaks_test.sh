#!/usr/bin/env bash
# The peaks `strata train` prints in its summary are the figures `memprof summary` reports for the trace of
# the same run: device, pinned host and NVMe, each the tier's peak over the run. The tiny model with the
# stock configs/zero3_nvme.json (its nvme_path pointed at a folder of the test's own), so all three tiers
# hold state. The summary names the trace file.
# usage: summary_peaks_test.sh STRATA MEMPROF NVME_CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 memprof=$2 config=$3 text=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir/nvme"
python3 - "$config" "$dir" <<'PY' || { echo "FAIL: cannot write the config"; exit 1; }
import json, sys
c = json.load(open(sys.argv[1]))
d = sys.argv[2]
for k in ("offload_param", "offload_optimizer"):
    c["zero_optimization"][k]["nvme_path"] = d + "/nvme"
c["gradient_accumulation_steps"] = 1
c.setdefault("strata", {})["memprof"] = {"path": d + "/trace.memprof.jsonl"}
json.dump(c, open(d + "/config.json", "w"))
PY
"$strata" train --config "$dir/config.json" --backend host --model tiny --text "$text" --seq-len 32 \
  --steps 3 --no-progress >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; echo "FAIL: training failed"; exit 1; }
"$memprof" summary "$dir/trace.memprof.jsonl" >"$dir/summary.txt" 2>&1 ||
  { cat "$dir/summary.txt"; echo "FAIL: memprof summary failed"; exit 1; }
cat "$dir/train.log" "$dir/summary.txt"
line=$(grep 'peak in use:' "$dir/train.log")
failed=0
for tier in device pinned nvme; do
  # strata train: "peak in use: device 1.50 MiB, pinned ..."; memprof: the tier's row ends in its peak.
  ours=$(echo "$line" | sed -E "s/.*peak in use:.* $tier ([0-9.]+ [KMGT]?i?B).*/\\1/")
  theirs=$(awk -v t="$tier" '$1 == t && NF > 3 { print $(NF-1), $NF; exit }' "$dir/summary.txt")
  echo "$tier: strata train $ours, memprof $theirs"
  [ -n "$ours" ] && [ "$ours" = "$theirs" ] || failed=1
  [ "$ours" != "0 B" ] || { echo "FAIL: $tier held nothing, so the comparison says little"; failed=1; }
done
[ $failed -eq 0 ] || { echo "FAIL: the summary's peaks differ from memprof's"; exit 1; }
# The trace is a file the run wrote outside the directories its command line named: the summary names it.
grep -qF "  trace       $dir/trace.memprof.jsonl (strata.memprof.path" "$dir/train.log" ||
  { echo "FAIL: the summary does not name the trace $dir/trace.memprof.jsonl"; exit 1; }
echo "PASS: the summary's peaks are memprof's"
