#!/usr/bin/env bash
# A stop signal during `strata train --save` (SIGTERM is what a preemptible machine sends; SIGINT is Ctrl-C):
# the step in progress finishes, a checkpoint is saved, the run exits 128 + the signal, the checkpoint
# loads, and nothing is left behind: no partial checkpoint, no temporary token file of --text (TMPDIR is a
# folder of the test's own), no swap file (the stock configs/zero3_nvme.json, its nvme_path pointed at a
# folder of the test's own). No timing: the signal is sent once the first step line is out.
# usage: stop_signal_test.sh STRATA NVME_CONFIG TEXT SCRATCH_DIR SIGNAL   (SIGNAL: TERM or INT)
set -u
strata=$1 config=$2 text=$3 dir=$4 sig=$5
case $sig in
  TERM) want=143 ;;
  INT) want=130 ;;
  *)
    echo "FAIL: usage: SIGNAL is TERM or INT, not $sig"
    exit 2
    ;;
esac
rm -rf "$dir" && mkdir -p "$dir/tmp" "$dir/nvme"
sed -e "s#/local_nvme#$dir/nvme#g" -e "s#\"gradient_accumulation_steps\": 16#\"gradient_accumulation_steps\": 1#" "$config" >"$dir/config.json"
config=$dir/config.json
sets=(--backend host)
# SIGINT is ignored by background jobs of a non-interactive shell unless the job resets it; setsid gives
# the run a session of its own, where both signals keep their default disposition.
TMPDIR="$dir/tmp" setsid "$strata" train --config "$config" "${sets[@]}" --model tiny --text "$text" \
  --seq-len 32 --steps 1000000 --save "$dir/ckpt" --no-progress >"$dir/log" 2>&1 &
pid=$!
until grep -q '^step 1/' "$dir/log"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$dir/log"
    echo "FAIL: the run ended before its first step"
    exit 1
  fi
  sleep 0.05
done
kill -"$sig" "$pid"
wait "$pid"
rc=$?
cat "$dir/log"
echo "exit status $rc"
[ "$rc" -eq "$want" ] || { echo "FAIL: expected exit status $want (128 + SIG$sig)"; exit 1; }
[ -f "$dir/ckpt/latest" ] || { echo "FAIL: no checkpoint was saved"; exit 1; }
if ls -d "$dir"/ckpt/*.tmp 2>/dev/null; then echo "FAIL: a partial checkpoint was left"; exit 1; fi
if [ -n "$(ls -A "$dir/tmp")" ]; then ls -la "$dir/tmp"; echo "FAIL: temporaries left in TMPDIR"; exit 1; fi
if [ -n "$(ls -A "$dir/nvme")" ]; then ls -laR "$dir/nvme"; echo "FAIL: swap files left in nvme_path"; exit 1; fi
"$strata" train --config "$config" "${sets[@]}" --model tiny --text "$text" --seq-len 32 --steps 1 \
  --load "$dir/ckpt" --no-progress || { echo "FAIL: the checkpoint does not load"; exit 1; }
echo "PASS: stopped by SIG$sig with a loadable checkpoint and nothing left behind"
