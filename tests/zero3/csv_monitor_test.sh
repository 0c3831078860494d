#!/usr/bin/env bash
# `strata train` with DeepSpeed's csv_monitor (and its tensorboard monitor beside it, into the same folder: one
# event file per run, holding every step's loss; tests/config/tensorboard_test.cpp reads the format record
# by record): the csv files land in output_path/job_name/, one per metric,
# each with the header `step,<metric>` and one row per optimizer step at step = samples so far; the losses
# are the ones the step lines print, at full precision; a resumed run appends under the same header; an
# output_path that cannot be created is refused before the first step, naming the keys.
# usage: csv_monitor_test.sh STRATA CONFIG TEXT SCRATCH_DIR   (CONFIG: micro batch 4, accumulation 1)
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
# steps_per_print 1: every step prints its line. $1: output_path, $2: the config written.
write_config() {
  python3 - "$config" "$1" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["steps_per_print"] = 1
c["csv_monitor"] = {"enabled": True, "output_path": sys.argv[2], "job_name": "tiny run"}
c["tensorboard"] = {"enabled": True, "output_path": sys.argv[2], "job_name": "tiny run"}
json.dump(c, open(sys.argv[3], "w"), indent=2)
EOF
}
write_config "$dir/metrics" "$dir/config.json"
train() {
  "$strata" train --config "$dir/config.json" --model tiny --text "$text" --seq-len 32 --no-progress "$@"
}
train --steps 3 --save "$dir/ckpt" >"$dir/run1.log" 2>&1 || { cat "$dir/run1.log"; fail "training failed"; }
cat "$dir/run1.log"

job="$dir/metrics/tiny run"
for m in train_loss lr grad_norm tokens_per_second time_total time_forward time_backward time_optimizer \
  time_wait bytes_device bytes_pinned bytes_nvme bytes_device_peak; do
  f="$job/Train_Samples_$m.csv"
  [ -f "$f" ] || fail "no $f"
  [ "$(head -n 1 "$f")" = "step,$m" ] || fail "$f: header $(head -n 1 "$f"), expected step,$m"
  [ "$(tail -n +2 "$f" | cut -d, -f1 | tr '\n' ' ')" = "4 8 12 " ] ||
    fail "$f: steps $(tail -n +2 "$f" | cut -d, -f1 | tr '\n' ' '), expected 4 8 12 (samples)"
done
# bf16 run: DeepSpeed writes loss_scale only with fp16.
[ ! -e "$job/Train_Samples_loss_scale.csv" ] || fail "loss_scale written for a bf16 run"

# The CSV's losses are the step lines' to the printed digits, and carry more digits than those lines.
python3 - "$dir/run1.log" "$job/Train_Samples_train_loss.csv" <<'EOF' || exit 1
import re, sys
printed = re.findall(r"^step \d+/3 loss (\S+)", open(sys.argv[1]).read(), re.M)
rows = [line.strip().split(",") for line in open(sys.argv[2]).readlines()[1:]]
if len(printed) != 3 or len(rows) != 3:
    sys.exit(f"FAIL: {len(printed)} step lines and {len(rows)} rows, expected 3 each")
for p, (_, v) in zip(printed, rows):
    # 6 significant digits on the line (%#.6g; at least 5 wanted), the CSV's value rounded the same way.
    if "%#.6g" % float(v) != p:
        sys.exit(f"FAIL: train_loss.csv has {v}, the step line prints {p} (expected {'%#.6g' % float(v)})")
if all(float(v) == float(p) for p, (_, v) in zip(printed, rows)):
    sys.exit("FAIL: train_loss.csv holds only the printed digits, not the full precision")
print("losses: the step lines' " + ", ".join(printed) + " are the CSV's " + ", ".join(v for _, v in rows))
EOF

# The tensorboard event file: named in the summary, one train_loss scalar per step.
events=$(ls "$job"/events.out.tfevents.* 2>/dev/null)
[ "$(echo "$events" | grep -c .)" -eq 1 ] || fail "expected one event file in $job, found: $events"
grep -qF "metrics     $events (tensorboard)" "$dir/run1.log" || fail "the summary does not name $events"
n=$(python3 -c 'import sys; print(open(sys.argv[1], "rb").read().count(b"Train/Samples/train_loss"))' "$events")
[ "$n" -eq 3 ] || fail "$events holds $n train_loss scalars, expected 3"

# Resuming into the same folder appends under the one header.
train --steps 1 --load "$dir/ckpt" >"$dir/run2.log" 2>&1 || { cat "$dir/run2.log"; fail "resume failed"; }
f="$job/Train_Samples_train_loss.csv"
[ "$(grep -c '^step,' "$f")" -eq 1 ] || fail "$f: the resumed run wrote a second header"
[ "$(tail -n +2 "$f" | cut -d, -f1 | tr '\n' ' ')" = "4 8 12 16 " ] || fail "$f: the resumed run's rows: $(cat "$f")"

# A folder that cannot be created: refused before the first step, naming the keys.
write_config /proc/strata-csv "$dir/bad.json"
out=$("$strata" train --config "$dir/bad.json" --model tiny --text "$text" --seq-len 32 --steps 1 \
  --no-progress 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "an unwritable csv_monitor.output_path was accepted"
if echo "$out" | grep -q '^step '; then fail "a step ran before the refusal"; fi
echo "$out" | grep -q 'csv_monitor.output_path/job_name: /proc/strata-csv/tiny run: cannot create' ||
  fail "the message does not name csv_monitor.output_path"
echo "PASS: csv_monitor files hold every step"
