#!/usr/bin/env bash
# `strata export`'s refusals end to end: each names what its user typed (OUT_DIR, CHECKPOINT; never strata
# train's --export), the path and what to do, and none is check text ("safetensors.cpp:204: `fd_ >= 0`
# failed"). OUT_DIR under a regular file cannot be made even by root; a read-only OUT_DIR is tried only
# where permissions bite (not as root). A sharded model directory with a shard gone names the shard, the
# index and what to do.
# usage: export_cli_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 0 --no-progress \
  --export "$dir/model.safetensors" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log"; fail "strata train --export failed"; }

# refuses EXPECTED_REGEX ARG...: `strata export ARG...` exits 1 with an error matching EXPECTED_REGEX.
refuses() {
  local expect=$1 out status
  shift
  out=$("$strata" export "$@" 2>&1)
  status=$?
  [ "$status" -eq 1 ] || { echo "$out"; fail "strata export $* exited $status, expected 1"; }
  grep -Eq -- "$expect" <<<"$out" || { echo "$out"; fail "strata export $*: no /$expect/"; }
  grep -Eq -- '--export|` failed|\.cpp:[0-9]' <<<"$out" && { echo "$out"; fail "strata export $*: check text or --export"; }
  echo "refused as expected: $(grep 'error' <<<"$out")"
}

echo "a regular file" >"$dir/file"
refuses "error: OUT_DIR $dir/file/out: cannot create the directory \(Not a directory\); choose a writable" \
  "$dir/model.safetensors" "$dir/file/out"
refuses "error: OUT_DIR $dir/file is a file" "$dir/model.safetensors" "$dir/file"
refuses "error: CHECKPOINT $dir/none: no such file or directory" "$dir/none" "$dir/out"

mkdir -p "$dir/read-only" && chmod 555 "$dir/read-only" || exit 1
if touch "$dir/read-only/probe" 2>/dev/null; then
  echo "read-only OUT_DIR: not tried, this user (root?) writes into a read-only directory"
else
  refuses "error: OUT_DIR $dir/read-only: not writable \(Permission denied" "$dir/model.safetensors" "$dir/read-only"
fi
chmod 755 "$dir/read-only"

"$strata" export "$dir/model.safetensors" "$dir/sharded" --max-shard-size 20KB >"$dir/export.log" 2>&1 ||
  { cat "$dir/export.log"; fail "the sharded export failed"; }
[ -f "$dir/sharded/model-00002-of-00004.safetensors" ] || { ls "$dir/sharded"; fail "expected 4 shards"; }
rm "$dir/sharded/model-00002-of-00004.safetensors"
refuses "error: safetensors index $dir/sharded/model.safetensors.index.json: 1 of the 4 shard files it lists is missing: $dir/sharded/model-00002-of-00004.safetensors .*download the model again" \
  "$dir/sharded" "$dir/out"
echo "PASS: strata export's refusals name the path and what to do"
