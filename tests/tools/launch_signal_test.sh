#!/usr/bin/env bash
# A stop signal to `strata launch` reaches every rank of a two-rank host-backend run (Note [Launcher
# signals] in tools/cmd_launch.cpp): the ranks finish the step in progress, save a checkpoint and the
# launcher exits 128 + the signal. The steps are made long (1000 accumulation micro-batches, seconds each):
# mpirun itself would kill the ranks within about two seconds of a SIGINT / SIGTERM.
#   sigterm: SIGTERM to the launcher's pid              -> exit 143, checkpoint saved
#   ctrl-c:  SIGINT to the launcher's process group, as a terminal's Ctrl-C sends it -> exit 130, saved
#   twice:   SIGTERM, then SIGTERM again a second later -> exit 143 at once, nothing saved
# Every mode also checks that no rank is left running.
# usage: launch_signal_test.sh STRATA CONFIG TEXT SCRATCH_DIR MODE
set -u
strata=$1 config=$2 text=$3 dir=$4 mode=$5
rm -rf "$dir" && mkdir -p "$dir" || { echo "FAIL: cannot make $dir"; exit 1; }
python3 - "$config" "$dir/config.json" <<'PY' || { echo "FAIL: cannot write the config"; exit 1; }
import json, sys
c = json.load(open(sys.argv[1]))
c["gradient_accumulation_steps"] = 1000  # seconds per step on the tiny model
json.dump(c, open(sys.argv[2], "w"))
PY
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Job control: the launcher runs in a process group of its own (pgid = its pid), as a shell's foreground job.
set -m
"$strata" launch --num_gpus 2 --backend host -- train --config "$dir/config.json" --model tiny \
  --text "$text" --seq-len 32 --steps 100 --no-progress --save "$dir/ckpt" >"$dir/launch.log" 2>&1 &
launcher=$!
set +m

fail() {
  cat "$dir/launch.log"
  echo "FAIL: $*"
  # Leave nothing running: the launcher ends the job at a second signal; then any rank still there.
  kill -TERM "$launcher" 2>/dev/null && sleep 1 && kill -TERM "$launcher" 2>/dev/null
  wait "$launcher" 2>/dev/null
  for p in $(pgrep -f -- "$dir/config.json"); do kill -KILL "$p" 2>/dev/null; done
  exit 1
}

# rank 0 prints its "train: ..." line just before the first step.
for _ in $(seq 300); do
  grep -q '^train: ' "$dir/launch.log" && break
  kill -0 "$launcher" 2>/dev/null || fail "the launch ended before the first step"
  sleep 0.1
done
grep -q '^train: ' "$dir/launch.log" || fail "no first step within 30 s"

case $mode in
  sigterm) kill -TERM "$launcher"; want=143 ;;
  ctrl-c) kill -INT -- "-$launcher"; want=130 ;;
  twice) kill -TERM "$launcher"; sleep 1; kill -TERM "$launcher"; want=143 ;;
  *) fail "unknown mode $mode" ;;
esac
signalled=$SECONDS
# The step in progress, the save and the exit: well within 50 s (the run itself would take minutes).
for _ in $(seq 500); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$launcher" 2>/dev/null && fail "the launcher still runs 50 s after the signal"
wait "$launcher"
rc=$?
took=$((SECONDS - signalled))
cat "$dir/launch.log"
echo "launcher exit status $rc, $took s after the signal"

failed=0
[ "$rc" -eq "$want" ] || { echo "FAIL: exit status $rc, expected $want"; failed=1; }
left=$(pgrep -f -- "$dir/config.json")
[ -z "$left" ] || { echo "FAIL: processes left running: $left"; failed=1; kill -KILL $left 2>/dev/null; }
grep -q 'strata: \(internal \)\?error' "$dir/launch.log" && { echo "FAIL: a rank reported an error"; failed=1; }
if [ "$mode" = twice ]; then
  [ ! -e "$dir/ckpt/latest" ] || { echo "FAIL: a second signal should end the job without a save"; failed=1; }
  [ "$took" -le 15 ] || { echo "FAIL: a second signal should end the job at once, took $took s"; failed=1; }
  [ $failed -eq 0 ] && echo "PASS: a second signal to the launcher ends the job at once, exit $rc"
  exit $failed
fi
name=$([ "$mode" = ctrl-c ] && echo SIGINT || echo SIGTERM)
grep -q "$name after step [0-9]*: saving a checkpoint and stopping" "$dir/launch.log" ||
  { echo "FAIL: the ranks did not report stopping on $name"; failed=1; }
tag=$(cat "$dir/ckpt/latest" 2>/dev/null)
for f in meta.json rank0.shard rank1.shard; do
  [ -n "$tag" ] && [ -s "$dir/ckpt/$tag/$f" ] || { echo "FAIL: no checkpoint file $dir/ckpt/${tag:-?}/$f"; failed=1; }
done
[ $failed -eq 0 ] && echo "PASS: $name to the launcher saved $dir/ckpt/$tag and exited $rc"
exit $failed
