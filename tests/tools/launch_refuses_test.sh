#!/usr/bin/env bash
# `strata launch -- <subcommand>` refuses every subcommand that works in one process (export, eval, config,
# report, nvme-tune): under mpirun each rank would run all of it, racing on the same files. It exits 1
# before starting anything, with an error that names the command and the line to run instead, and writes
# nothing.
# usage: launch_refuses_test.sh STRATA SCRATCH_DIR
set -u
strata=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || { echo "FAIL: cannot make $dir"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
check() {  # SUBCOMMAND ARGS...
  local sub=$1
  "$strata" launch --num_gpus 2 -- "$@" >"$dir/$sub.log" 2>&1
  local rc=$?
  cat "$dir/$sub.log"
  [ "$rc" -eq 1 ] || { echo "FAIL: strata launch -- $sub exited $rc, expected 1"; failed=1; }
  grep -q "error: \`strata $sub\` runs in one process.*run it without the launcher: strata $sub" "$dir/$sub.log" ||
    { echo "FAIL: strata launch -- $sub: no error naming the command and what to run instead"; failed=1; }
}
check export "$dir/ckpt" "$dir/model"
check eval --model "$dir/model" --data "$dir/tokens.bin"
check config "$dir/ds.json"
check report
check nvme-tune --path "$dir/nvme"
left=$(ls "$dir" | grep -v '\.log$')
[ -z "$left" ] || { echo "FAIL: a refused command wrote $left"; failed=1; }
[ $failed -eq 0 ] && echo "PASS: the launcher refuses single-process subcommands, naming the command to run"
exit $failed
