#!/usr/bin/env bash
# `strata config new` driven as a person drives it (docs/config.md, "Writing a config"): in a terminal
# (tmux), the model and the row length typed, Enter taking the defaults of micro-batch, NVMe, precision and
# GPUs, the device's memory typed; the wizard prints the placements table and writes the file, and
# `strata train` runs that file without edits. Then `--yes` with flags writes the same file without a
# terminal.
# usage: config_wizard_test.sh STRATA TEXT SCRATCH_DIR
set -u
strata=$1 text=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
command -v tmux >/dev/null || fail "tmux is not installed (scripts/install-deps.sh installs it)"
sock=strata-wizard-$$
term() { tmux -L "$sock" "$@"; }
trap 'term kill-server 2>/dev/null' EXIT
screen() { term capture-pane -p -S -300 -t wizard; }
# Waits (up to 60 s) until the screen shows the extended regular expression $1.
wait_for() {
  for _ in $(seq 600); do
    screen | grep -qE "$1" && return 0
    sleep 0.1
  done
  echo "--- the screen:"; screen
  fail "the wizard never showed /$1/"
}
term new-session -d -s wizard -x 200 -y 80 \
  "STRATA_RATES_CACHE=$dir/rates.json $strata config new out.json --backend host; echo WIZARD-EXIT=\$?; sleep 120"
wait_for '^model \(a preset.*\[125m\]:$'
term send-keys -t wizard tiny Enter
wait_for '^tokens a row \[64\]:$'
term send-keys -t wizard 32 Enter
wait_for '^micro-batch .*\[1\]:$'
term send-keys -t wizard Enter
wait_for '^NVMe directories .*:$'
term send-keys -t wizard none Enter
wait_for '^precision .*\[bf16\]:$'
term send-keys -t wizard Enter
wait_for '^GPUs to train on \[1\]:$'
term send-keys -t wizard Enter
wait_for '^device memory .*:$'
term send-keys -t wizard 1GiB Enter
wait_for 'WIZARD-EXIT=[0-9]+'
screen | grep -q 'WIZARD-EXIT=0' || { screen; fail "the wizard exited with an error"; }
screen | grep -q '^placements (offload_param.device / offload_optimizer.device' || { screen; fail "no placements table"; }
screen | grep -qE '^wrote out.json: offload param (none|cpu|nvme) / optimizer (none|cpu|nvme)' ||
  { screen; fail "no \"wrote out.json\" line"; }
[ -s out.json ] || fail "out.json was not written"
python3 - <<'PY' || fail "out.json is not the config asked for"
import json
c = json.load(open("out.json"))
assert c["train_micro_batch_size_per_gpu"] == 1 and c["bf16"]["enabled"] is True, c
z = c["zero_optimization"]
assert z["offload_param"]["device"] in ("none", "cpu") and z["offload_optimizer"]["device"] in ("none", "cpu"), z
assert all(not isinstance(v, str) for k, v in z.items() if k.startswith("stage3_")), z  # sizes as numbers
assert c["strata"] == {"backend": "host", "device_memory_cap": "1GiB"}, c  # trains on the device planned for
PY
"$strata" train --config out.json --model tiny --text "$text" --seq-len 32 --steps 2 --no-progress >train.log 2>&1 ||
  { cat train.log; fail "strata train refused the written config"; }
grep -q '^summary: 2 steps' train.log || { cat train.log; fail "strata train did not train 2 steps"; }
# The same answers from flags and --yes, without a terminal: the same file.
STRATA_RATES_CACHE=$dir/rates.json "$strata" config new again.json --yes --backend host --model tiny --seq-len 32 \
  --nvme-path none --device-memory 1GiB </dev/null >yes.log 2>&1 || { cat yes.log; fail "--yes failed"; }
cmp -s out.json again.json || { diff out.json again.json; fail "--yes with the same answers wrote another file"; }
echo "PASS: the wizard's file trains as written"
