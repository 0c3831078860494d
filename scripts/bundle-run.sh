#!/usr/bin/env bash
# run.sh of the GPU bundle (scripts/gpu-bundle.sh puts this file at the top of the archive as run.sh).
# Runs everything a GPU machine has to say about Strata in one command and writes it to OUTDIR: the
# driver and devices (cuda_probe), `strata report`, every test binary, `strata train --backend cuda` of the
# 1b preset with CPU and with NVMe offload, bench/step's cuda rows, and the cuda losses against the host
# backend's on the same batches. Each stage is time-boxed; results.json and summary.txt are rewritten after
# every stage, so a run cut short still leaves what it measured.
#
# Usage:
#   run.sh [--host-only] [--stages LIST] [--nvme-path DIR] [--budget SECONDS] OUTDIR
#   run.sh --exec COMMAND [ARGS...]     one command with the bundle's libraries (bin/ first on PATH)
#
#   --host-only   no GPU expected (the rehearsal in a bare root file system): every test binary and short
#                 host-backend `strata train` runs of the 10m preset; cuda tests skip, which is no failure
#   --stages      comma-separated, run in this order: libraries, probe, report, tests, train, bench,
#                 compare. Default: all but compare (the cuda losses against the host backend's on the
#                 same batches, about 3 minutes more: `--stages libraries,compare` runs it alone)
#   --nvme-path   where the NVMe offload run swaps (default: a folder under $TMPDIR or /tmp, removed after)
#   --budget      seconds the whole run may take (default: the time boxes' sum, 470 for the default
#                 stages, 180 more with compare); each stage stops at its time box or at the budget
#
# Exit status: 0 when everything passed; 1 when a test failed or could not start, no cuda test ran or one
# skipped for want of a GPU, a test of a path the binary was built with (cuDNN attention, NCCL) was
# skipped, a training run failed (or its time box stopped it before 3 steps), the benchmark failed, or the
# compared losses differ by more than 0.02; 2 on a usage error. docs/gpu-bundle.md has the details.

# The stage functions run through stage(), which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start_time=$(date +%s)

# ---------------------------------------------------------------------------------------------------------
# The libraries: ours in lib/, the CUDA 13 ones from /usr/local/cuda or the nvidia-* Python wheels.

# Sonames of the CUDA libraries the binaries load (cudart, cuBLAS, NVRTC, NCCL, cuDNN 9 and its engines).
cuda_sonames=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libnccl.so.2 libcudnn.so.9
              libcudnn_graph.so.9 libcudnn_engines_precompiled.so.9)

# Folders that may hold them, most specific first: the toolkit, then every nvidia-* wheel that a Python
# on this machine (or a usual install location) has.
cuda_candidate_dirs() {
  local d py
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
    [ -d "$d" ] && echo "$d"
  done
  for py in python3 python3.13 python3.12 python3.11 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - <<'PY' 2>/dev/null
import glob, os, site
roots = list(site.getsitepackages()) + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(d)
PY
  done
  for d in /usr/local/lib/python3*/*-packages/nvidia/*/lib /usr/lib/python3*/*-packages/nvidia/*/lib \
           /opt/conda/lib/python3*/site-packages/nvidia/*/lib /opt/*/lib/python3*/site-packages/nvidia/*/lib \
           "${HOME:-/root}"/.local/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && echo "$d"
  done
}

# LD_LIBRARY_PATH: lib/, then each candidate folder that holds one of the CUDA sonames (in order, once),
# then what was set before, then lib-fallback/ (cuDNN's dispatcher, for a machine without cuDNN 9).
setup_libraries() {
  local dirs=() d s seen=" "
  while IFS= read -r d; do
    d=$(readlink -f "$d")
    case $seen in *" $d "*) continue ;; esac
    seen="$seen$d "
    for s in "${cuda_sonames[@]}"; do
      if [ -e "$d/$s" ]; then dirs+=("$d"); break; fi
    done
  done < <(cuda_candidate_dirs)
  local cuda_path
  cuda_path=$(IFS=:; echo "${dirs[*]:-}")
  export LD_LIBRARY_PATH="$here/lib${cuda_path:+:$cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$here/lib-fallback"
  export PATH="$here/bin:$PATH"
}

setup_libraries
if [ "${1:-}" = "--exec" ]; then
  shift
  [ $# -gt 0 ] || { echo "run.sh --exec: give a command" >&2; exit 2; }
  exec "$@"
fi

host_only=0
stages=libraries,probe,report,tests,train,bench
budget=
nvme_path=
out=
while [ $# -gt 0 ]; do
  case $1 in
    --host-only) host_only=1 ;;
    --stages) stages=${2:?--stages needs a list}; shift ;;
    --nvme-path) nvme_path=${2:?--nvme-path needs a folder}; shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    -h | --help) sed -n '2,/^$/p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (run.sh --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "run.sh: one OUTDIR only" >&2; exit 2; }; out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "usage: run.sh [--host-only] [--stages LIST] [--nvme-path DIR] [--budget S] OUTDIR" >&2; exit 2; }
for s in ${stages//,/ }; do
  case $s in
    libraries | probe | report | tests | train | bench | compare) ;;
    *) echo "run.sh: unknown stage '$s' (libraries, probe, report, tests, train, bench, compare)" >&2; exit 2 ;;
  esac
done
want() { [[ ",$stages," == *",$1,"* ]]; }
# Time boxes, in seconds (the GPU machine: 16 cores, one H100). Each stage takes at most its box, or what
# is left of the budget (--budget: by default the boxes' sum, 470 s for the default stages) when that is less.
if [ "$host_only" = 1 ]; then
  declare -A box=([tests]=1800 [train_cpu]=120 [train_nvme]=120)
else
  declare -A box=([tests]=150 [train_cpu]=80 [train_nvme]=150 [bench]=70 [compare_cuda]=60 [compare_host]=120)
fi
if [ -z "$budget" ]; then
  budget=20  # libraries, probe and report take seconds
  for s in ${stages//,/ }; do
    case $s in
      tests | bench) budget=$((budget + ${box[$s]:-0})) ;;
      train) budget=$((budget + box[train_cpu] + box[train_nvme])) ;;
      compare) [ "$host_only" = 1 ] || budget=$((budget + box[compare_cuda] + box[compare_host])) ;;
    esac
  done
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/strata-run.XXXXXX") || exit 2
trap 'rm -rf "$scratch"' EXIT
export STRATA_TEST_TMPDIR=${STRATA_TEST_TMPDIR:-$scratch/test-tmp}
mkdir -p "$STRATA_TEST_TMPDIR"
[ -n "$nvme_path" ] || nvme_path=$scratch/nvme
mkdir -p "$nvme_path" || exit 2

# manifest.env (written by gpu-bundle.sh): what the bundle was built with.
bundle_commit=unknown bundle_date=unknown bundle_cuda=unknown glibc_floor=unknown glibcxx_need=unknown
# shellcheck source=/dev/null
[ -f "$here/manifest.env" ] && . "$here/manifest.env"

# ---------------------------------------------------------------------------------------------------------
# Bookkeeping: failures, stage times, the JSON.

failures=()
fail() { failures+=("$*"); echo "FAIL: $*"; }
elapsed() { echo $(($(date +%s) - start_time)); }
# stage_cap WANT: the seconds a stage may take: WANT, or what is left of the budget when that is less
# (at least 1: `timeout 0` would mean no limit). Earlier stages come first.
stage_cap() {
  local left=$((budget - $(elapsed)))
  [ "$left" -ge 1 ] || left=1
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/ /g' | tr -d '\r\n'; }
json_str() { printf '"%s"' "$(json_escape "$1")"; }
# A JSON number, or null for an empty or non-numeric value.
json_num() { case $1 in '' | *[!0-9.eE+-]*) echo null ;; *) echo "$1" ;; esac; }

declare -A stage_seconds=()
stage_order=()
declare -A train_json=()
train_order=()
tests_json=null
bench_json=null
compare_json=null
machine_gpu=none
machine_driver=none

write_results() {
  local status=$1 f s first=1
  {
    printf '{\n  "schema": "strata.gpu-bundle", "version": 1,\n'
    printf '  "mode": %s, "status": %s, "seconds": %s,\n' "$(json_str "$([ "$host_only" = 1 ] && echo host-only || echo gpu)")" \
      "$(json_str "$status")" "$(elapsed)"
    printf '  "bundle": {"commit": %s, "built": %s, "cuda": %s, "glibc_floor": %s},\n' "$(json_str "$bundle_commit")" \
      "$(json_str "$bundle_date")" "$(json_str "$bundle_cuda")" "$(json_str "$glibc_floor")"
    printf '  "machine": {"gpu": %s, "driver": %s, "cpus": %s},\n' "$(json_str "$machine_gpu")" \
      "$(json_str "$machine_driver")" "$(nproc)"
    printf '  "failures": ['
    for f in "${failures[@]}"; do
      [ "$first" = 1 ] || printf ', '
      first=0
      json_str "$f"
    done
    printf '],\n  "stage_seconds": {'
    first=1
    for s in "${stage_order[@]}"; do
      [ "$first" = 1 ] || printf ', '
      first=0
      printf '%s: %s' "$(json_str "$s")" "${stage_seconds[$s]}"
    done
    printf '},\n  "tests": %s,\n  "train": {' "$tests_json"
    first=1
    for s in "${train_order[@]}"; do
      [ "$first" = 1 ] || printf ','
      first=0
      printf '\n    %s: %s' "$(json_str "$s")" "${train_json[$s]}"
    done
    printf '},\n  "loss_compare": %s,\n  "step_bench": %s\n}\n' "$compare_json" "$bench_json"
  } >"$out/results.json.tmp" && mv "$out/results.json.tmp" "$out/results.json"
}

# stage NAME COMMAND...: runs one stage, records its wall time, rewrites summary.txt and results.json.
stage() {
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo
  echo "=== $name ($(elapsed) s into the run)"
  "$@"
  stage_seconds[$name]=$(($(date +%s) - t0))
  stage_order+=("$name")
  summary running
}

# ---------------------------------------------------------------------------------------------------------
# Stages.

stage_libraries() {
  # Every shared library each binary needs must resolve, in a version it accepts; the CUDA ones are shown
  # with the folder they come from.
  local b line missing=0 non_cuda=0
  : >"$out/libraries-missing.txt"
  for b in "$here"/bin/*; do
    while IFS= read -r line; do
      echo "$(basename "$b"): $line" >>"$out/libraries-missing.txt"
      missing=1
      [[ "$line" =~ libcuda|libcudart|libcublas|libnvrtc|libnccl|libcudnn ]] || non_cuda=1
    done < <(ldd "$b" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//')
  done
  { ldd "$here/bin/strata"; [ -e "$here/bin/test_kernels" ] && ldd "$here/bin/test_kernels"; } >"$out/libraries.txt" 2>&1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$out/libraries.txt"
  grep -E 'libcudart|libcublas|libnvrtc|libnccl|libcudnn|libstdc\+\+' "$out/libraries.txt" | sed 's/ (0x.*//' | sort -u
  # The machine's glibc and C++ runtime against what the binaries need (manifest.env).
  local glibc
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  echo "glibc ${glibc:-unknown} here; the bundle needs $glibc_floor and libstdc++ with GLIBCXX_$glibcxx_need"
  if [ -n "$glibc" ] && [ "$glibc_floor" != unknown ] &&
     [ "$(printf '%s\n' "$glibc" "$glibc_floor" | sort -V | tail -1)" != "$glibc" ]; then
    fail "this machine's glibc $glibc is older than the $glibc_floor the bundle was built for"
  fi
  if [ "$missing" = 1 ]; then
    sed 's/^/  /' "$out/libraries-missing.txt" | sort -u | head -20
    if [ "$host_only" = 1 ] && [ "$non_cuda" = 0 ]; then
      echo "(host only: the binaries that need the missing CUDA libraries cannot start here)"
    else
      fail "shared libraries not found (libraries-missing.txt); the CUDA 13 ones come from /usr/local/cuda or the nvidia-* wheels"
    fi
  fi
}

stage_probe() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.txt"
    machine_gpu=$(head -1 "$out/nvidia-smi.txt" | cut -d, -f2 | sed 's/^ *//')
    machine_driver=$(head -1 "$out/nvidia-smi.txt" | cut -d, -f3 | sed 's/^ *//')
  else
    echo "nvidia-smi: not found"
  fi
  if timeout -k 5 60 "$here/bin/cuda_probe" >"$out/probe.txt" 2>&1; then
    cat "$out/probe.txt"
  else
    cat "$out/probe.txt"
    echo "cuda_probe: no usable CUDA device (a CUDA 13 build needs an NVIDIA driver >= 580)"
    [ "$host_only" = 1 ] || fail "cuda_probe found no usable CUDA device"
  fi
}

stage_report() {
  timeout -k 5 "$(stage_cap 60)" "$here/bin/strata" report --nvme-path "$nvme_path" >"$out/report.txt" 2>&1
  local rc=$?
  cat "$out/report.txt"
  [ "$rc" = 0 ] || fail "strata report exited $rc"
}

# --- tests -------------------------------------------------------------------------------------------------
# Binaries run side by side (bounded), the longest split into GoogleTest shards; each job is time-boxed.
# Multi-rank binaries need mpirun (OpenMPI's launcher, not in the bundle): they are only loaded and listed.
multi_rank_tests=" test_ranks "
declare -A test_shards=([test_zero3]=4 [test_cpu_optim]=2 [test_kernels]=2 [test_tiering]=2 [test_model]=2)

# The skip reasons that mean "no usable GPU" (tests/kernels/cuda_test_util.h, tiering, zero3).
no_gpu_re='no CUDA GPU visible|cudaGetDeviceCount|CUDA driver version is insufficient'

# The end of GoogleTest's line for a finished test: its name (a parameterised one's followed by ", where
# GetParam() = ..."), then the time. The list at the end of a run repeats the names without a time.
test_end='[^ ,]*(, where .*)? \([0-9]+ ms\)$'

# count_lines REGEX FILE...: matching lines over the files.
count_lines() {
  local re=$1
  shift
  cat "$@" 2>/dev/null | grep -cE "$re"
}

# A test's skip reason: the lines between "Skipped" and its [  SKIPPED ] line, joined.
skip_reasons() {
  awk '/^\[ RUN      \] /{name=$4; reason=""; inskip=0; next}
       /: Skipped$/{inskip=1; next}
       /^\[  SKIPPED \] .* \([0-9]+ ms\)$/{if (inskip) print name ": " reason; inskip=0; next}
       inskip && NF {reason = reason (reason == "" ? "" : " ") $0}' "$@"
}

stage_tests() {
  local logs=$out/tests
  mkdir -p "$logs"
  rm -f "$logs"/*.log "$logs"/*.rc
  local jobs=$(( $(nproc) / 4 ))
  [ "$jobs" -ge 2 ] || jobs=2
  local cap
  cap=$(stage_cap "${box[tests]}")
  local t name shards i bins=()
  for t in "$here"/bin/test_*; do bins+=("$(basename "$t")"); done
  for name in "${bins[@]}"; do
    if [[ "$multi_rank_tests" == *" $name "* ]]; then
      echo "$name: multi-rank (needs mpirun -np 2 and 3; OpenMPI's launcher is not in the bundle): loaded and listed, not run"
      timeout -k 5 60 "$here/bin/$name" --gtest_list_tests >"$logs/$name.list" 2>&1
      echo $? >"$logs/$name.listrc"
      continue
    fi
    shards=${test_shards[$name]:-1}
    for ((i = 0; i < shards; i++)); do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      (
        if [ "$shards" -gt 1 ]; then export GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i; fi
        t0=$(date +%s)
        timeout -k 10 "$cap" "$here/bin/$name" >"$logs/$name.$i.log" 2>&1
        rc=$?
        echo "$rc $(($(date +%s) - t0))" >"$logs/$name.$i.rc"
        echo "  $name${GTEST_TOTAL_SHARDS:+ shard $i/$shards}: exit $rc in $(($(date +%s) - t0)) s"
      ) &
    done
  done
  wait

  # One row per binary: GoogleTest's per-test lines, summed over its shards.
  local rows=() bjson=() tp=0 tf=0 ts=0 tc=0 passed failed skipped cuda result rc secs r s
  local built_cudnn built_nccl
  for name in "${bins[@]}"; do
    if [[ "$multi_rank_tests" == *" $name "* ]]; then
      rc=$(cat "$logs/$name.listrc")
      result="listed (multi-rank)"
      [ "$rc" = 0 ] || { result="FAIL (cannot start: exit $rc)"; fail "$name does not start (exit $rc; tests/$name.list)"; }
      rows+=("$(printf '%-22s %7s %7s %8s %9s %6s  %s' "$name" - - - - - "$result")")
      bjson+=("$(printf '%s: {"result": %s}' "$(json_str "$name")" "$(json_str "$result")")")
      continue
    fi
    passed=$(count_lines "^\\[       OK \\] $test_end" "$logs/$name".*.log)
    failed=$(count_lines "^\\[  FAILED  \\] $test_end" "$logs/$name".*.log)
    skipped=$(count_lines "^\\[  SKIPPED \\] $test_end" "$logs/$name".*.log)
    cuda=$(count_lines "^\\[ +(OK|FAILED) +\\] [^ ,]*[Cc]uda$test_end" "$logs/$name".*.log)
    result=pass secs=0
    for r in "$logs/$name".*.rc; do
      read -r rc s <"$r"
      [ "$s" -gt "$secs" ] && secs=$s
      if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        result="FAIL (timed out after ${cap}s)"
      elif [ "$rc" != 0 ] && [ "$result" = pass ]; then
        result="FAIL (exit $rc)"
      fi
    done
    if [ "$result" != pass ]; then
      fail "$name: $result; $failed failed (tests/$name.*.log)"
      grep -hE "^\\[  FAILED  \\] $test_end" "$logs/$name".*.log | sed 's/^/    /'
    fi
    # A path the binary was built with must not be skipped: its tests are the only GPU evidence for it.
    skip_reasons "$logs/$name".*.log >"$logs/$name.skips"
    built_cudnn=0 built_nccl=0
    grep -q "^$name:.*libcudnn" "$here/manifest-needed.txt" 2>/dev/null && built_cudnn=1
    grep -q "^$name:.*libnccl" "$here/manifest-needed.txt" 2>/dev/null && built_nccl=1
    if [ "$host_only" = 0 ]; then
      if [ "$built_cudnn" = 1 ] && grep -qE '^[^ :]*Cudnn[^ :]*:' "$logs/$name.skips"; then
        fail "$name was built with cuDNN attention but skipped its cuDNN tests: $(grep -m1 -E '^[^ :]*Cudnn' "$logs/$name.skips")"
      fi
      if [ "$built_nccl" = 1 ] && grep -qE '^[^ :]*Nccl[^ :]*:' "$logs/$name.skips"; then
        fail "$name was built with NCCL but skipped its NCCL tests: $(grep -m1 -E '^[^ :]*Nccl' "$logs/$name.skips")"
      fi
    fi
    tp=$((tp + passed)) tf=$((tf + failed)) ts=$((ts + skipped)) tc=$((tc + cuda))
    rows+=("$(printf '%-22s %7s %7s %8s %9s %6s  %s' "$name" "$passed" "$failed" "$skipped" "$cuda" "$secs" "$result")")
    bjson+=("$(printf '%s: {"passed": %s, "failed": %s, "skipped": %s, "cuda_ran": %s, "seconds": %s, "result": %s}' \
      "$(json_str "$name")" "$passed" "$failed" "$skipped" "$cuda" "$secs" "$(json_str "$result")")")
  done
  {
    printf '%-22s %7s %7s %8s %9s %6s  %s\n' binary passed failed skipped "cuda ran" secs result
    printf '%s\n' "${rows[@]}"
    printf '%-22s %7s %7s %8s %9s\n' total "$tp" "$tf" "$ts" "$tc"
  } >"$out/tests.txt"
  cat "$out/tests.txt"
  cat "$logs"/*.skips >"$out/skipped.txt" 2>/dev/null
  echo "skipped tests and their reasons: $out/skipped.txt"
  # A GPU run: some cuda test ran, and none skipped for want of a GPU (a few cuda-named tests check what
  # happens without one, so a count alone could pass on a machine whose GPU is not usable).
  local no_gpu
  no_gpu=$(grep -cE "$no_gpu_re" "$out/skipped.txt")
  if [ "$host_only" = 1 ]; then
    echo "$no_gpu tests skipped for want of a GPU (host only: expected)"
  else
    [ "$tc" -gt 0 ] || fail "no CUDA test ran: every cuda test was skipped ($(grep -m1 -E "$no_gpu_re" "$out/skipped.txt"))"
    [ "$no_gpu" = 0 ] || fail "$no_gpu tests skipped for want of a GPU, e.g. $(grep -m1 -E "$no_gpu_re" "$out/skipped.txt")"
  fi
  local IFS=,
  tests_json="{\"passed\": $tp, \"failed\": $tf, \"skipped\": $ts, \"cuda_ran\": $tc, \"skipped_without_gpu\": $no_gpu, \"binaries\": {${bjson[*]}}}"
}

# --- training ----------------------------------------------------------------------------------------------
# The text the runs train on: the bundle's documentation, tokenized as bytes.
train_text() {
  local text=$scratch/train.txt
  [ -s "$text" ] || cat "$here"/src/README.md "$here"/src/docs/*.md >"$text"
  echo "$text"
}

# train_run NAME BACKEND CONFIG MODEL MICRO_BATCH SEQ_LEN STEPS CAP: one `strata train`, every step printed
# (steps_per_print 1), NVMe offload swapping under $nvme_path; the log and figures go to OUTDIR/train-NAME/.
train_run() {
  local name=$1 backend=$2 config=$3 model=$4 mb=$5 seq=$6 steps=$7 cap=$8
  local dir=$out/train-$name
  mkdir -p "$dir"
  if [ "$cap" -lt 20 ]; then
    fail "train $name: not run, ${cap}s left of the run's budget"
    train_json[$name]='{"status": "not run (out of time)"}'
    train_order+=("$name")
    return
  fi
  # The stock config with this run's batch (one micro-batch per step), every step printed, and the NVMe
  # offload swapping under $nvme_path.
  sed -e "s/\"train_micro_batch_size_per_gpu\": *[0-9]*/\"train_micro_batch_size_per_gpu\": $mb/" \
    -e 's/"gradient_accumulation_steps": *[0-9]*/"gradient_accumulation_steps": 1/' \
    -e 's/"steps_per_print": *[0-9]*/"steps_per_print": 1/' -e "s#/local_nvme#$nvme_path/$name#g" \
    "$here/src/configs/$config" >"$dir/config.json"
  mkdir -p "$nvme_path/$name"
  local cmd=(strata train --config "$dir/config.json" --model "$model" --text "$(train_text)" --seq-len "$seq"
             --steps "$steps" --backend "$backend" --no-progress)
  echo "${cmd[*]}" | tee "$dir/command.txt"
  local t0 rc
  t0=$(date +%s)
  (cd "$dir" && timeout -k 10 "$cap" "${cmd[@]}") >"$dir/train.log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0))
  rm -rf "${nvme_path:?}/$name"
  # The log's head, first and last step, and summary.
  awk '/^step [0-9]+\// {split($2, n, "/"); if (n[1] != 1 && n[1] != n[2]) next}
       /^(train:|device plan|step |summary:|  )/' "$dir/train.log"
  # Per step (from the step lines): loss, seconds, tokens/s. The steady state leaves out step 1, which
  # records the trace; a run its time box stopped keeps the steps it finished.
  local losses times ndone status=pass
  losses=$(awk '/^step [0-9]+\// {v = $4; if (v !~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) v = "null"  # nan, inf
                                  printf "%s%s", sep, v; sep = ","}' "$dir/train.log")
  times=$(awk '/^step [0-9]+\// {for (i = 1; i < NF; i++) if ($i == "time") {t = $(i + 1); sub("s$", "", t)}
                                  printf "%s%s", sep, t; sep = ","}' "$dir/train.log")
  ndone=$(grep -c '^step [0-9]*/' "$dir/train.log")
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    if [ "$ndone" -ge 3 ]; then
      status="partial: $ndone of $steps steps in its ${cap}s time box"
    else
      status="timed out after ${cap}s at step $ndone of $steps"
    fi
  elif [ "$rc" != 0 ]; then
    status="exit $rc: $(grep -m1 -iE 'error' "$dir/train.log" | cut -c1-300)"
  elif [ "$ndone" != "$steps" ]; then
    status="$ndone of $steps steps printed"
  fi
  [ "$status" = pass ] || [[ "$status" == partial* ]] ||
    fail "train $name ($backend, $model): $status (train-$name/train.log)"
  # Steady state: the mean over steps 2.. of tokens/s and of the step's split.
  local st fw bw op wt tps_steady tps
  read -r tps_steady st fw bw op wt < <(awk '
    /^step [0-9]+\// {
      split($2, n, "/"); if (n[1] == 1) next
      for (i = 1; i < NF; i++) {
        v = $(i + 1); sub("s$", "", v)
        if ($i == "tok/s") s[0] += v; else if ($i == "time") s[1] += v; else if ($i == "fwd") s[2] += v
        else if ($i == "bwd") s[3] += v; else if ($i == "opt") s[4] += v; else if ($i == "wait") s[5] += v
      }
      c++
    }
    END { if (c) printf "%.0f %.3f %.3f %.3f %.3f %.3f\n", s[0]/c, s[1]/c, s[2]/c, s[3]/c, s[4]/c, s[5]/c
          else print "" }' "$dir/train.log")
  # The summary's tokens/s: all tokens over the whole run's wall time, set-up and step 1 included.
  tps=$(sed -n 's/^summary: .* \([0-9.]*\) tokens\/s$/\1/p' "$dir/train.log")
  train_json[$name]=$(printf '{"status": %s, "backend": %s, "config": %s, "model": %s, "micro_batch": %s, "seq_len": %s, "steps": %s, "steps_done": %s, "seconds": %s, "tokens_per_s": %s, "tokens_per_s_steady": %s, "step_time_steady": {"total": %s, "forward": %s, "backward": %s, "optimizer": %s, "wait": %s}, "losses": [%s], "step_seconds": [%s]}' \
    "$(json_str "$status")" "$(json_str "$backend")" "$(json_str "$config")" "$(json_str "$model")" "$mb" "$seq" \
    "$steps" "$ndone" "$secs" "$(json_num "$tps")" "$(json_num "$tps_steady")" "$(json_num "$st")" "$(json_num "$fw")" \
    "$(json_num "$bw")" "$(json_num "$op")" "$(json_num "$wt")" "$losses" "$times")
  train_order+=("$name")
  printf '%-13s %s; %s steps in %s s; %s tokens/s (steady %s); step %ss: fwd %s bwd %s opt %s wait %s\n' \
    "$name" "$status" "$ndone" "$secs" "${tps:-?}" "${tps_steady:-?}" "${st:-?}" "${fw:-?}" "${bw:-?}" "${op:-?}" \
    "${wt:-?}" >>"$out/train.txt"
}

# The losses of two runs on the same batches, step by step: the largest difference, against 0.02.
compare_losses() {
  local a=$1 b=$2 la lb
  la=$(sed -n 's/^step [0-9]*\/[0-9]* loss \([^ ]*\) .*/\1/p' "$out/train-$a/train.log" | tr '\n' ' ')
  lb=$(sed -n 's/^step [0-9]*\/[0-9]* loss \([^ ]*\) .*/\1/p' "$out/train-$b/train.log" | tr '\n' ' ')
  local verdict
  verdict=$(awk -v a="$la" -v b="$lb" 'BEGIN {
      n = split(a, x, " "); m = split(b, y, " ");
      if (n == 0 || n != m) { printf "steps %d %d", n, m; exit }
      d = 0; for (i = 1; i <= n; i++) { e = x[i] - y[i]; if (e < 0) e = -e; if (e > d) d = e }
      printf "max %.6g over %d", d, n }')
  local max steps
  case $verdict in
    max*)
      max=$(echo "$verdict" | awk '{print $2}') steps=$(echo "$verdict" | awk '{print $4}')
      compare_json=$(printf '{"runs": [%s, %s], "steps": %s, "max_abs_diff": %s, "bound": 0.02, "pass": %s}' \
        "$(json_str "$a")" "$(json_str "$b")" "$steps" "$max" \
        "$(awk -v d="$max" 'BEGIN {print (d <= 0.02) ? "true" : "false"}')")
      echo "losses $a: $la"
      echo "losses $b: $lb"
      echo "largest difference over $steps steps: $max (bound 0.02)"
      awk -v d="$max" 'BEGIN {exit !(d > 0.02)}' && fail "losses of $a and $b differ by $max (> 0.02)"
      ;;
    *)
      compare_json=$(printf '{"runs": [%s, %s], "pass": false, "why": %s}' "$(json_str "$a")" "$(json_str "$b")" \
        "$(json_str "step counts differ: $verdict")")
      fail "losses of $a and $b cannot be compared ($verdict)"
      ;;
  esac
}

stage_train_gpu() {
  # The 1b preset (1.1B parameters), 4 x 1024 tokens per step, one micro-batch per step.
  train_run cpu cuda zero3_cpu.json 1b 4 1024 20 "$(stage_cap "${box[train_cpu]}")"
  train_run nvme cuda zero3_nvme.json 1b 4 1024 20 "$(stage_cap "${box[train_nvme]}")"
}

stage_bench() {
  local cap
  cap=$(stage_cap "${box[bench]}")
  local cmd=(step_bench --backend cuda --model 1b -B 4 -T 512 --placements cpu --overlap "off,on" --ratio "1,auto"
             --sub-group-size 50000000 --clip 0 --nvme-path "$nvme_path")
  echo "${cmd[*]}" | tee "$out/step_bench.command.txt"
  timeout -k 10 "$cap" "${cmd[@]}" >"$out/step_bench.log" 2>&1
  local rc=$?
  grep -v '^{' "$out/step_bench.log"
  local line
  line=$(grep '^{' "$out/step_bench.log" | tail -1)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    bench_json=$line
  else
    bench_json=$(printf '{"status": %s}' "$(json_str "exit $rc$([ "$rc" = 124 ] && echo " (timed out after ${cap}s)")")")
    fail "step_bench exited $rc (step_bench.log)"
  fi
}

stage_compare() {
  # The same batches on both backends: 1b, 1 x 256 tokens, 3 steps, CPU offload.
  train_run compare-cuda cuda zero3_cpu.json 1b 1 256 3 "$(stage_cap "${box[compare_cuda]}")"
  train_run compare-host host zero3_cpu.json 1b 1 256 3 "$(stage_cap "${box[compare_host]}")"
  compare_losses compare-cuda compare-host
}

stage_train_host() {
  # The host backend end to end: the 10m preset, a few steps, with each offload target.
  train_run host-cpu host zero3_cpu.json 10m 2 128 4 "$(stage_cap "${box[train_cpu]}")"
  train_run host-nvme host zero3_nvme.json 10m 2 128 4 "$(stage_cap "${box[train_nvme]}")"
}

summary() {
  local status=$1
  {
    echo "strata GPU bundle $bundle_commit (built $bundle_date, CUDA $bundle_cuda), run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "GPU: $machine_gpu, driver $machine_driver, $(nproc) CPUs; mode $([ "$host_only" = 1 ] && echo host-only || echo gpu); $(elapsed) s"
    echo
    cat "$out/tests.txt" 2>/dev/null
    echo
    cat "$out/train.txt" 2>/dev/null
    [ "$compare_json" = null ] || echo "loss comparison: $compare_json"
    echo
    [ "$status" != running ] || echo "RUNNING: done so far: ${stage_order[*]}"
    if [ ${#failures[@]} -eq 0 ]; then
      [ "$status" = running ] || echo PASS
    else
      printf 'FAIL: %s\n' "${failures[@]}"
    fi
  } >"$out/summary.txt"
  write_results "$status"
}

main() {
  echo "strata GPU bundle $bundle_commit (built $bundle_date), results in $out; stages $stages, budget ${budget}s"
  # Pinned host memory beyond RLIMIT_MEMLOCK stays unlocked (strata report says so); lift it where allowed.
  ulimit -l unlimited 2>/dev/null || echo "RLIMIT_MEMLOCK stays $(ulimit -l) KiB (ulimit -l unlimited refused)"
  rm -f "$out/train.txt" "$out/tests.txt"
  want libraries && stage libraries stage_libraries
  want probe && stage probe stage_probe
  want report && stage report stage_report
  want tests && stage tests stage_tests
  if want train; then
    if [ "$host_only" = 1 ]; then stage train stage_train_host; else stage train stage_train_gpu; fi
  fi
  if [ "$host_only" = 0 ]; then
    want bench && stage bench stage_bench
    want compare && stage compare stage_compare
  fi
  local status=pass
  [ ${#failures[@]} -eq 0 ] || status=fail
  summary "$status"
  echo
  echo "=== summary ($out/summary.txt, $out/results.json)"
  cat "$out/summary.txt"
  [ "$status" = pass ]
}

main 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
