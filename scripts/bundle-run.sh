#!/usr/bin/env bash
# run.sh of the GPU bundle (scripts/gpu-bundle.sh puts this file at the top of the archive as run.sh).
# One timeline of stages, most valuable first, each with its own deadline and the whole run with one
# (--budget); a later stage gets what is left. A stage that reaches its deadline is killed with every
# process it started, recorded as such (a training run that finished 3 steps keeps them: "partial"), and
# the timeline goes on. docs/gpu-bundle.md has the details.
#
#   libraries     the CUDA 13 libraries found by path; every binary's libraries resolve and it starts
#   probe         nvidia-smi, bin/cuda_probe (no usable GPU: the GPU stages are skipped, the run fails)
#   report        strata report
#   kernel-tests  the cuda tests (--gtest_filter) of the non-engine binaries, sharded
#   train-cpu     strata train --backend cuda --model 1b with configs/zero3_cpu.json: tokens/s, TFLOP/s
#   engine-tests  the cuda tests of the engine binaries (test_zero3, test_model, test_tools), sharded
#   train-nvme    the same with configs/zero3_nvme.json, strata.aio.backend auto: the aio backend it chose
#   bench         bench/step's cuda rows, only when the time left holds its deadline
#   compare       (optional) the cuda losses against the host backend's on the same batches
#
# OUTDIR holds three files, rewritten after every stage: results.tar.gz (everything: run.log, each
# stage's output, each test binary's log, the training logs, summary.txt, results.json), summary.txt (one
# screen) and results.json. The work folder ($TMPDIR or /tmp) is removed at the end.
#
# Usage:
#   run.sh [--host-only] [--stages LIST] [--budget SECONDS] [--nvme-path DIR] OUTDIR
#   run.sh --exec COMMAND [ARGS...]     one command with the bundle's libraries (bin/ first on PATH)
#
#   --host-only   no GPU expected (the rehearsal in a bare root): the same stages with the host
#                 backend's stand-ins: the test stages run their binaries whole, the training runs, the
#                 bench and compare take the 10m preset on the host backend; deadlines for 2 cores
#   --stages      comma-separated stage names (tests: both test stages, train: both training runs), run
#                 in the timeline's order. Default: all but compare
#   --budget      seconds the whole run may take (default 480; --host-only the deadlines' sum, 1350)
#   --nvme-path   where the NVMe offload runs swap (default: the work folder)
#
# Exit status: 0 when no stage failed (a training run kept as partial and a stage skipped for want of
# time are no failure); 1 otherwise, a GPU run without a usable GPU included; 2 on a usage error.
#
# One file, past the usual length: it is what the archive carries to a machine that has nothing else,
# and the stages re-run it (--run-stage) in sessions of their own.

# The stage functions are called by name, which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
self=$here/$(basename "$0")
start_time=$(date +%s)
orig_ld_path=${LD_LIBRARY_PATH:-}

# ---------------------------------------------------------------------------------------------------------
# Libraries: ours in lib/, the CUDA 13 ones found by path (never by asking a Python), lib-fallback/ last.

# Sonames the binaries load (NEEDED) or cuDNN opens at run time.
cuda_sonames=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libnccl.so.2 libcudnn.so.9
              libcudnn_graph.so.9 libcudnn_engines_precompiled.so.9 libcudnn_engines_runtime_compiled.so.9
              libcudnn_heuristic.so.9)

# library_dirs NAME...: folders that may hold the libraries, most preferred first: LD_LIBRARY_PATH as
# given, the CUDA toolkit, ldconfig's cache, then the site-packages trees of the usual Python installs
# (the nvidia-* wheels: nvidia/cu13/lib, nvidia/<name>/lib), searched with find -maxdepth.
library_dirs() {
  local d sp names=() n
  local -a entries
  IFS=: read -ra entries <<<"$orig_ld_path"
  for d in "${entries[@]}"; do [ -n "$d" ] && echo "$d"; done
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 \
           /usr/local/cuda-*/lib /usr/local/cuda-*/targets/*/lib; do
    [ -d "$d" ] && echo "$d"
  done
  local ldconfig
  ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  "$ldconfig" -p 2>/dev/null | awk -v want=" $* " '/x86-64/ && index(want, " " $1 " ") {sub(/.*=> /, ""); print}' |
    while IFS= read -r n; do dirname "$n"; done
  for n in "$@"; do names+=(-o -name "$n"); done
  for sp in /opt/*/.venv/lib/python3*/site-packages /opt/*/lib/python3*/site-packages \
            /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages /usr/lib/python3/dist-packages \
            "${HOME:-/root}"/.local/lib/python3*/site-packages; do
    [ -d "$sp" ] && timeout 30 find "$sp" -maxdepth 4 \( "${names[@]:1}" \) -printf '%h\n' 2>/dev/null
  done
}

# lib_version FOLDER SONAME: the library's version, found by path: the wheel that installed it (a
# dist-info/RECORD up to four folders above lists the file: nvidia_cublas-13.1.0.3; wheels carry no
# symlinks, so their files are named by soname), else the CUDA toolkit's version.json, else "-".
lib_version() {
  local dir=$1 so=$2 a rec key i
  a=$dir
  for ((i = 0; i < 4; i++)); do
    a=$(dirname "$a")
    for rec in "$a"/*.dist-info/RECORD "$a"/dist-info/*.dist-info/RECORD; do
      if [ -f "$rec" ] && grep -q "/$so," "$rec"; then basename "$(dirname "$rec")" .dist-info; return; fi
    done
    if [ -f "$a/version.json" ]; then
      case $so in libcudart*) key=cuda_cudart ;; libcublas*) key=libcublas ;; libnvrtc*) key=cuda_nvrtc ;; *) break ;; esac
      awk -v k="\"$key\"" 'index($0, k) {f = 1} f && /"version"/ {gsub(/[",]/, ""); print "toolkit-" $NF; exit}' \
        "$a/version.json" | grep . && return
      break
    fi
  done
  echo -
}

# find_libraries NAME...: chooses, for each name, the first folder of library_dirs that holds it; sets
# lib_dirs (the chosen folders in order) and writes "name folder real-file version" lines to stdout: the
# real file after readlink -f (libcublas.so.13.1.0.3 where the soname is a link) and lib_version's ("-"
# for what is not known or not found).
find_libraries() {
  local d s seen=" " dirs=()
  while IFS= read -r d; do
    d=$(readlink -f "$d") || continue
    case $seen in *" $d "*) continue ;; esac
    seen="$seen$d "
    dirs+=("$d")
  done < <(library_dirs "$@")
  lib_dirs=()
  local used=" "
  for s in "$@"; do
    local found=-
    for d in "${dirs[@]}"; do
      if [ -e "$d/$s" ]; then found=$d; break; fi
    done
    if [ "$found" = - ]; then
      echo "$s - - -"
    else
      echo "$s $found $(basename "$(readlink -f "$found/$s")") $(lib_version "$found" "$s")"
      case $used in *" $found "*) ;; *) used="$used$found "; lib_dirs+=("$found") ;; esac
    fi
  done
}

# set_library_path: LD_LIBRARY_PATH = lib/, the chosen folders in order, what was set before, lib-fallback/
# (cuDNN's dispatcher, for a machine without cuDNN 9). Writes the choice to $1 when given.
set_library_path() {
  local listing=${1:-/dev/null} names=("${cuda_sonames[@]}") n
  if [ "$listing" != /dev/null ]; then
    # Whatever else a binary needs that lib/ and the system do not have.
    export LD_LIBRARY_PATH="$here/lib${orig_ld_path:+:$orig_ld_path}:$here/lib-fallback"
    while IFS= read -r n; do
      [[ " ${names[*]} " == *" $n "* ]] || names+=("$n")
    done < <(for b in "$here"/bin/*; do ldd "$b" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u)
  fi
  find_libraries "${names[@]}" >"$listing"
  local path
  path=$(IFS=:; echo "${lib_dirs[*]:-}")
  export LD_LIBRARY_PATH="$here/lib${path:+:$path}${orig_ld_path:+:$orig_ld_path}:$here/lib-fallback"
  export PATH="$here/bin:$PATH"
}

if [ "${1:-}" = "--exec" ]; then
  shift
  [ $# -gt 0 ] || { echo "run.sh --exec: give a command" >&2; exit 2; }
  set_library_path
  exec "$@"
fi

# ---------------------------------------------------------------------------------------------------------
# Options. --run-stage, --until and --work are internal: the timeline runs each stage as
# `run.sh --run-stage NAME --until EPOCH --work DIR` in a session of its own, so it can be killed whole.

host_only=0 stages_opt='' budget='' nvme_path='' out='' run_stage='' until='' work=
while [ $# -gt 0 ]; do
  case $1 in
    --host-only) host_only=1 ;;
    --stages) stages_opt=${2:?--stages needs a list}; shift ;;
    --nvme-path) nvme_path=${2:?--nvme-path needs a folder}; shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --run-stage) run_stage=$2; shift ;;
    --until) until=$2; shift ;;
    --work) work=$2; shift ;;
    -h | --help) sed -n '2,/^$/p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (run.sh --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "run.sh: one OUTDIR only" >&2; exit 2; }; out=$1 ;;
  esac
  shift
done

# The timeline, in order: each stage's deadline in seconds on the GPU machine (16 cores, one H100 or
# H200; the default budget of 480 s leaves a rerun inside a 15-minute lease) and with --host-only (the
# rehearsal on 2 cores), and the least time a stage is started with (less left: skipped, saying so).
#   stage        gpu  host  least
stage_table='
    libraries     20   120     5
    probe         30    30     5
    report        20    60     5
    kernel-tests 110   300    20
    train-cpu     90   120    30
    engine-tests 100   480    20
    train-nvme   100   120    30
    bench         60   120    60
    compare      150   120    60'
timeline=()
declare -A deadline=() need=()
while read -r s g h l; do
  [ -n "$s" ] || continue
  timeline+=("$s")
  deadline[$s]=$([ "$host_only" = 1 ] && echo "$h" || echo "$g") need[$s]=$l
done <<<"$stage_table"
gpu_stages=" kernel-tests train-cpu engine-tests train-nvme bench compare "

# Tests: the engine's binaries run in engine-tests, every other test_* binary in kernel-tests. On a GPU
# only the tests the filter selects run: parameterised names ending in /cuda or /cuda_*, suites and tests
# named Cuda*, Cudnn*, Nccl*.
engine_bins=" test_zero3 test_model test_tools test_ranks "
multi_rank_bins=" test_ranks "  # needs mpirun -np 2 and 3; OpenMPI's launcher is not in the bundle
gpu_filter='*cuda*:*Cuda*:*CUDA*:*cudnn*:*Cudnn*:*nccl*:*Nccl*'
# Tests per shard on a GPU (default 40): test_comm_nccl makes a communicator per test.
declare -A gpu_per_shard=([test_comm_nccl]=25 [test_zero3]=4 [test_kernels]=30)
# Shards of whole binaries with --host-only (about 100 s of test_zero3 on 2 cores).
declare -A host_shards=([test_zero3]=4 [test_cpu_optim]=2 [test_nvme]=2 [test_model]=2)

# manifest.env (written by gpu-bundle.sh): what the bundle was built with.
bundle_commit=unknown bundle_date=unknown bundle_cuda=unknown glibc_floor=unknown glibcxx_need=unknown
# shellcheck source=/dev/null
[ -f "$here/manifest.env" ] && . "$here/manifest.env"

count_list() { awk '/^[^ ]/ {next} /^  [^ ]/ {n++} END {print n + 0}' "$@" 2>/dev/null; }
left() { echo $((until - $(date +%s))); }
# cap MARGIN: the seconds a command inside the stage may take so that it ends MARGIN before the deadline.
cap() { local c=$(($(left) - $1)); [ "$c" -ge 1 ] && echo "$c" || echo 1; }

# =========================================================================================================
# The stages' work, each in its own session (run_stage_*). They write logs and "rc seconds" files only;
# the timeline reads them (read_*), so a stage killed at its deadline still leaves what it did.

run_stage_libraries() {
  cat "$res/libraries.txt"
  : >"$res/libraries-missing.txt"
  local b line
  for b in "$here"/bin/*; do
    ldd "$b" 2>&1 | grep 'not found' | sed "s/^[[:space:]]*/$(basename "$b"): /" >>"$res/libraries-missing.txt"
  done
  { ldd "$here/bin/strata"; ldd "$here/bin/test_kernels"; } >"$res/ldd.txt" 2>&1
  getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' >"$res/glibc.txt"
  # Every test binary starts: it lists its tests, and the ones the GPU filter selects.
  mkdir -p "$res/tests"
  for b in "$here"/bin/test_*; do
    while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
    (
      n=$(basename "$b")
      timeout -k 5 "$(cap 2)" "$b" --gtest_list_tests >"$res/tests/$n.list" 2>&1
      echo $? >"$res/tests/$n.list.rc"
      timeout -k 5 "$(cap 2)" "$b" --gtest_list_tests --gtest_filter="$gpu_filter" >"$res/tests/$n.gpu-list" 2>&1
    ) &
  done
  wait
  for line in "$res"/tests/*.list.rc; do
    b=$(basename "$line" .list.rc)
    echo "$b: exit $(cat "$line"), $(count_list "$res/tests/$b.list") tests, $(count_list "$res/tests/$b.gpu-list") cuda"
  done
}

run_stage_probe() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout -k 5 "$(cap 15)" nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader \
      >"$res/nvidia-smi.txt" 2>&1
  else
    echo "nvidia-smi: not found" >"$res/nvidia-smi.txt"
  fi
  cat "$res/nvidia-smi.txt"
  local t0=$SECONDS
  timeout -k 5 "$(cap 3)" "$here/bin/cuda_probe" >"$res/probe.txt" 2>&1
  echo "$? $((SECONDS - t0))" >"$res/probe.rc"
  cat "$res/probe.txt"
}

run_stage_report() {
  timeout -k 5 "$(cap 3)" "$here/bin/strata" report --nvme-path "$nvme_path" >"$res/report.txt" 2>&1
  echo "$?" >"$res/report.rc"
  cat "$res/report.txt"
}

# run_tests GROUP: the group's binaries, side by side, the big ones in GoogleTest shards. Writes
# tests/GROUP.plan ("binary shards run|listed|none" lines), then tests/<binary>.<shard>.log and .rc.
run_tests() {
  local group=$1 b n count shards i jobs queue=()
  local plan=$res/tests/$group.plan
  mkdir -p "$res/tests"
  : >"$plan"
  for b in "$here"/bin/test_*; do
    n=$(basename "$b")
    if [[ "$engine_bins" == *" $n "* ]]; then [ "$group" = engine-tests ] || continue
    else [ "$group" = kernel-tests ] || continue; fi
    [ -s "$res/tests/$n.gpu-list" ] ||
      timeout -k 5 60 "$b" --gtest_list_tests --gtest_filter="$gpu_filter" >"$res/tests/$n.gpu-list" 2>&1
    count=$(count_list "$res/tests/$n.gpu-list")
    if [[ "$multi_rank_bins" == *" $n "* ]]; then
      echo "$n 0 listed" >>"$plan"
    elif [ "$host_only" = 1 ]; then
      shards=${host_shards[$n]:-1}
      echo "$n $shards run" >>"$plan"
      queue+=("$((shards * 1000 + count)) $n $shards")
    elif [ "$count" = 0 ]; then
      echo "$n 0 none" >>"$plan"
    else
      shards=$(((count + ${gpu_per_shard[$n]:-40} - 1) / ${gpu_per_shard[$n]:-40}))
      echo "$n $shards run" >>"$plan"
      queue+=("$((shards * 1000 + count)) $n $shards")
    fi
  done
  cat "$plan"
  # Side by side: a quarter as many jobs as cores on the host (at least 2), 6 on a GPU machine.
  jobs=$(($(nproc) / 4))
  [ "$jobs" -ge 2 ] || jobs=2
  [ "$host_only" = 1 ] || jobs=6
  local item filter=()
  [ "$host_only" = 1 ] || filter=(--gtest_filter="$gpu_filter")
  # The most shards first: they are the longest.
  while read -r _ n shards; do
    for ((i = 0; i < shards; i++)); do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      (
        if [ "$shards" -gt 1 ]; then export GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i; fi
        t0=$(date +%s)
        timeout -k 5 "$(cap 5)" "$here/bin/$n" "${filter[@]}" >"$res/tests/$n.$i.log" 2>&1
        rc=$?
        echo "$rc $(($(date +%s) - t0))" >"$res/tests/$n.$i.rc"
        echo "  $n${GTEST_TOTAL_SHARDS:+ shard $i/$shards}: exit $rc in $(($(date +%s) - t0)) s"
      ) &
    done
  done < <(for item in "${queue[@]}"; do echo "$item"; done | sort -rn)
  wait
}
run_stage_kernel-tests() { run_tests kernel-tests; }
run_stage_engine-tests() { run_tests engine-tests; }

# The text the runs train on: the bundle's documentation, tokenized as bytes.
train_text() {
  local text=$scratch/train.txt
  [ -s "$text" ] || cat "$here"/src/README.md "$here"/src/docs/*.md >"$text"
  echo "$text"
}

# train_run NAME BACKEND CONFIG MODEL MICRO_BATCH SEQ_LEN STEPS MARGIN: one `strata train` in train-NAME/,
# every step printed, NVMe offload swapping under $nvme_path/NAME, stopped (SIGTERM: it ends its step
# and prints its summary) MARGIN seconds before the stage's deadline, killed up to 20 s later (at the
# latest 5 s before the deadline).
train_run() {
  local name=$1 backend=$2 config=$3 model=$4 mb=$5 seq=$6 steps=$7 margin=$8
  local dir=$res/train-$name
  mkdir -p "$dir" "$nvme_path/$name"
  echo "$backend $config $model $mb $seq $steps" >"$dir/settings"
  # The stock config with this run's batch (one micro-batch per step), every step printed, the NVMe
  # offload under $nvme_path and the aio backend chosen at run time.
  sed -e "s/\"train_micro_batch_size_per_gpu\": *[0-9]*/\"train_micro_batch_size_per_gpu\": $mb/" \
    -e 's/"gradient_accumulation_steps": *[0-9]*/"gradient_accumulation_steps": 1/' \
    -e 's/"steps_per_print": *[0-9]*/"steps_per_print": 1/' -e "s#/local_nvme#$nvme_path/$name#g" \
    -e 's/"backend": *"\(io_uring\|libaio\|psync\)"/"backend": "auto"/' \
    "$here/src/configs/$config" >"$dir/config.json"
  local cmd=(strata train --config "$dir/config.json" --model "$model" --text "$(train_text)" --seq-len "$seq"
             --steps "$steps" --backend "$backend" --no-progress)
  echo "${cmd[*]}" | tee "$dir/command.txt"
  local t0=$SECONDS
  # --foreground: the SIGTERM goes to strata alone, once (timeout otherwise signals its process group
  # too, and a second signal makes strata exit at once, without ending its step or printing its summary).
  local grace=$((margin - 5 < 20 ? margin - 5 : 20))
  (cd "$dir" && timeout --foreground -k "$grace" "$(cap "$margin")" "${cmd[@]}") >"$dir/train.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$dir/rc"
  rm -rf "${nvme_path:?}/$name"
  grep -E '^(train:|step 1/|summary:)|aio backend' "$dir/train.log"
}

run_stage_train-cpu() {
  if [ "$host_only" = 1 ]; then train_run cpu host zero3_cpu.json 10m 2 128 4 10
  else train_run cpu cuda zero3_cpu.json 1b 4 1024 10 15; fi
}

run_stage_train-nvme() {
  if [ "$host_only" = 1 ]; then train_run nvme host zero3_nvme.json 10m 2 128 4 10
  else train_run nvme cuda zero3_nvme.json 1b 4 1024 4 25; fi
}

run_stage_bench() {
  local cmd
  if [ "$host_only" = 1 ]; then
    # The ceiling on the host backend's device (model::DeviceChunks), the same code as cuda's.
    cmd=(step_bench --backend host --model 10m -B 2 -T 128 --placements cpu --overlap "off,on" --ratio "1,auto"
         --sub-group-size 5000000 --clip 0 --steps 2 --ceiling device --nvme-path "$nvme_path")
  else
    cmd=(step_bench --backend cuda --model 1b -B 4 -T 512 --placements cpu --overlap "off,on" --ratio "1,auto"
         --sub-group-size 50000000 --clip 0 --nvme-path "$nvme_path")
  fi
  echo "${cmd[*]}" | tee "$res/step_bench.command.txt"
  local t0=$SECONDS
  timeout -k 5 "$(cap 5)" "${cmd[@]}" >"$res/step_bench.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$res/step_bench.rc"
  grep -v '^{' "$res/step_bench.log"
}

run_stage_compare() {
  # The same seed and data, so the same batches: on a GPU, cuda against host (1b, 1 x 256 tokens, 3 steps,
  # CPU offload); host-only, the host backend with CPU against NVMe offload (10m), bit-identical by design.
  if [ "$host_only" = 1 ]; then
    train_run compare-a host zero3_cpu.json 10m 1 128 3 $(($(left) / 2 + 5))
    train_run compare-b host zero3_nvme.json 10m 1 128 3 5
  else
    train_run compare-a cuda zero3_cpu.json 1b 1 256 3 $(($(left) * 2 / 3 + 5))
    train_run compare-b host zero3_cpu.json 1b 1 256 3 5
  fi
}

if [ -n "$run_stage" ]; then
  res=$work/strata-results scratch=$work/scratch
  export STRATA_TEST_TMPDIR=$scratch/test-tmp
  [ -n "$nvme_path" ] || nvme_path=$scratch/nvme
  echo "$$" >"$res/stages/$run_stage.sid"
  "run_stage_$run_stage"
  exit
fi

# =========================================================================================================
# The timeline (this process): runs each stage in its own session, kills the session at the deadline,
# reads what the stage left, and packs everything after each stage.

[ -n "$out" ] || { echo "usage: run.sh [--host-only] [--stages LIST] [--budget S] [--nvme-path DIR] OUTDIR" >&2; exit 2; }
selected=" "
IFS=, read -ra asked <<<"${stages_opt:-libraries,probe,report,tests,train,bench}"
for s in "${asked[@]}"; do
  case $s in
    tests) selected="$selected kernel-tests engine-tests " ;;
    train) selected="$selected train-cpu train-nvme " ;;
    *) [[ " ${timeline[*]} " == *" $s "* ]] ||
         { echo "run.sh: unknown stage '$s' (${timeline[*]}, tests, train)" >&2; exit 2; }
       selected="$selected $s " ;;
  esac
done
case $budget in *[!0-9]* | 0*) echo "run.sh: --budget takes whole seconds, not '$budget'" >&2; exit 2 ;; esac
if [ -z "$budget" ]; then
  budget=480
  if [ "$host_only" = 1 ]; then
    budget=0
    for s in "${timeline[@]}"; do [[ "$selected" == *" $s "* ]] && budget=$((budget + ${deadline[$s]})); done
  fi
fi
command -v setsid >/dev/null || { echo "run.sh: needs setsid (util-linux)" >&2; exit 2; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/strata-run.XXXXXX") || exit 2
res=$work/strata-results scratch=$work/scratch
mkdir -p "$res/stages" "$scratch/test-tmp"
[ -n "$nvme_path" ] || nvme_path=$scratch/nvme
mkdir -p "$nvme_path" || exit 2
rm -f "$out/results.tar.gz" "$out/summary.txt" "$out/results.json"
trap 'rm -rf "$work"' EXIT

elapsed() { echo $(($(date +%s) - start_time)); }
json_escape() {
  local v=${1//\\/\\\\}
  v=${v//\"/\\\"} v=${v//$'\t'/ } v=${v//$'\r'/} v=${v//$'\n'/ }
  printf '%s' "$v"
}
json_str() { printf '"%s"' "$(json_escape "$1")"; }
# A JSON number, or null for an empty or non-numeric value.
json_num() { case $1 in '' | *[!0-9.eE+-]*) echo null ;; *) echo "$1" ;; esac; }

failures=()
fail() { failures+=("$*"); echo "FAIL: $*"; }
# stage_failed NAME: a failure of that stage was recorded.
stage_failed() { local f; for f in "${failures[@]}"; do [[ "$f" == "$1: "* ]] && return 0; done; return 1; }
declare -A st_status=() st_secs=() st_deadline=() st_note=() tests_json=() train_json=()
stage_order=()
bench_json=null compare_json=null
machine_gpu=none machine_driver=none gpu_ok=1 glibc_here=unknown

# session_pids SID: the processes of a session (/proc/PID/stat's sixth field), read with builtins only.
session_pids() {
  local p st rest s
  for p in /proc/[0-9]*; do
    read -r st <"$p/stat" 2>/dev/null || continue
    rest=${st##*) }       # state ppid pgrp session ...
    rest=${rest#* } rest=${rest#* } rest=${rest#* }
    s=${rest%% *}
    [ "$s" = "$1" ] && echo "${p#/proc/}"
  done
}

# kill_session SID: SIGTERM to every process of the session, SIGKILL to what is left 5 s later.
kill_session() {
  local sid=$1 pids i
  pids=$(session_pids "$sid")
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null
  for ((i = 0; i < 20; i++)); do
    sleep 0.25
    pids=$(session_pids "$sid")
    [ -n "$pids" ] || return 0
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  sleep 0.5
}

# run_killable NAME SECONDS: the stage's work in a session of its own; killed=1 when its deadline came.
current_sid=
run_killable() {
  local name=$1 secs=$2 pid t_end
  t_end=$(($(date +%s) + secs))
  local opts=(--run-stage "$name" --until "$t_end" --work "$work" --nvme-path "$nvme_path")
  [ "$host_only" = 1 ] && opts+=(--host-only)
  setsid -w bash "$self" "${opts[@]}" >"$res/stages/$name.out" 2>&1 </dev/null &
  pid=$!
  current_sid=$pid
  killed=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$t_end" ]; then
      killed=1
      kill_session "$(cat "$res/stages/$name.sid" 2>/dev/null || echo "$pid")"
      kill_session "$pid"
      break
    fi
    sleep 0.25
  done
  wait "$pid" 2>/dev/null
  # Whatever the stage left running (a test's child, a stopped run) goes too.
  kill_session "$(cat "$res/stages/$name.sid" 2>/dev/null || echo "$pid")"
  current_sid=
}

# ---------------------------------------------------------------------------------------------------------
# Reading what each stage left: set status (pass, fail, partial, deadline) and note, call fail.

read_libraries() {
  local n missing non_cuda
  glibc_here=$(cat "$res/glibc.txt" 2>/dev/null)
  glibc_here=${glibc_here:-unknown}
  note="glibc $glibc_here (floor $glibc_floor)"
  if [ "$glibc_here" != unknown ] && [ "$glibc_floor" != unknown ] &&
     [ "$(printf '%s\n' "$glibc_here" "$glibc_floor" | sort -V | tail -1)" != "$glibc_here" ]; then
    fail "libraries: this machine's glibc $glibc_here is older than the bundle's floor $glibc_floor"
  fi
  # The C++ runtime is the machine's: it must have the symbol version the binaries need.
  local libstdcxx
  libstdcxx=$(awk '$1 == "libstdc++.so.6" {print $3; exit}' "$res/ldd.txt" 2>/dev/null)
  if [ -n "$libstdcxx" ] && [ "$glibcxx_need" != unknown ] && ! grep -qa "GLIBCXX_$glibcxx_need" "$libstdcxx"; then
    fail "libraries: $libstdcxx lacks GLIBCXX_$glibcxx_need, which the binaries need (GCC 12's libstdc++ or newer)"
  fi
  missing=$(cut -d' ' -f2- "$res/libraries-missing.txt" 2>/dev/null | awk '{print $1}' | sort -u | tr '\n' ' ')
  non_cuda=$(echo "$missing" | tr ' ' '\n' | grep -vE '^(libcuda|libcudart|libcublas|libnvrtc|libnccl|libcudnn)' | grep . | tr '\n' ' ')
  if [ -n "$missing" ]; then
    if [ "$host_only" = 1 ] && [ -z "$non_cuda" ]; then
      note="$note; CUDA libraries not found (host only: no failure): $missing"
    else
      fail "libraries: not found: $missing(libraries-missing.txt); the CUDA 13 ones come from /usr/local/cuda or the nvidia-* wheels"
    fi
  fi
  local started=0 bad=()
  for n in "$res"/tests/*.list.rc; do
    [ -e "$n" ] || continue
    if [ "$(cat "$n")" = 0 ]; then started=$((started + 1)); else bad+=("$(basename "$n" .list.rc)"); fi
  done
  note="$started test binaries start; $note"
  [ ${#bad[@]} = 0 ] || fail "libraries: ${bad[*]} cannot start (tests/<binary>.list)"
}

read_probe() {
  local rc
  if grep -q ',' "$res/nvidia-smi.txt" 2>/dev/null; then
    machine_gpu=$(head -1 "$res/nvidia-smi.txt" | cut -d, -f2 | sed 's/^ *//')
    machine_driver=$(head -1 "$res/nvidia-smi.txt" | cut -d, -f3 | sed 's/^ *//')
  fi
  read -r rc _ <"$res/probe.rc" 2>/dev/null || rc=killed
  note=$(grep -m1 '^device 0' "$res/probe.txt" 2>/dev/null || grep -m1 . "$res/probe.txt" 2>/dev/null)
  if [ "$rc" != 0 ]; then
    gpu_ok=0
    if [ "$host_only" = 1 ]; then
      note="no GPU (host only: expected): $note"
    else
      fail "probe: no usable CUDA device (cuda_probe exit $rc: $note; a CUDA 13 build needs driver >= 580); the GPU stages are skipped"
    fi
  fi
}

read_report() {
  local rc
  rc=$(cat "$res/report.rc" 2>/dev/null || echo killed)
  note=$(grep -E '^ *GPUs ' "$res/report.txt" 2>/dev/null | sed -e 's/^ *//' -e 's/  */ /g' | cut -c1-100)
  [ "$rc" = 0 ] || fail "report: strata report exited $rc (report.txt)"
}

# The end of GoogleTest's line for a finished test: its name (a parameterised one's followed by ", where
# GetParam() = ..."), then the time. The list at the end of a run repeats the names without a time.
test_end='[^ ,]*(, where .*)? \([0-9]+ ms\)$'
# The skip reasons that mean "no usable GPU" (tests/kernels/cuda_test_util.h, tiering, zero3).
no_gpu_re='no CUDA GPU visible|cudaGetDeviceCount|CUDA driver version is insufficient'
count_lines() { local re=$1; shift; cat "$@" 2>/dev/null | grep -cE "$re"; }
# A test's skip reason: the lines between "Skipped" and its [  SKIPPED ] line, joined.
skip_reasons() {
  awk '/^\[ RUN      \] /{name=$4; reason=""; inskip=0; next}
       /: Skipped$/{inskip=1; next}
       /^\[  SKIPPED \] .* \([0-9]+ ms\)$/{if (inskip) print name ": " reason; inskip=0; next}
       inskip && NF {reason = reason (reason == "" ? "" : " ") $0}' "$@" 2>/dev/null
}

read_tests() {
  local group=$1 logs=$res/tests name shards mode
  local rows=() bjson=() tp=0 tf=0 ts=0 tc=0 nb=0 passed failed skipped cuda result secs rc s i timed_out=0
  while read -r name shards mode; do
    if [ "$mode" != run ]; then
      result="listed: $([ "$mode" = listed ] && echo "multi-rank, needs mpirun" || echo "no cuda tests")"
      rows+=("$(printf '%-16s %6s %6s %7s %5s %5s  %s' "$name" - - - - - "$result")")
      bjson+=("$(printf '%s: {"result": %s}' "$(json_str "$name")" "$(json_str "$result")")")
      continue
    fi
    nb=$((nb + 1))
    passed=$(count_lines "^\\[       OK \\] $test_end" "$logs/$name".*.log)
    failed=$(count_lines "^\\[  FAILED  \\] $test_end" "$logs/$name".*.log)
    skipped=$(count_lines "^\\[  SKIPPED \\] $test_end" "$logs/$name".*.log)
    cuda=$(count_lines "^\\[ +(OK|FAILED) +\\] [^ ,]*(Cuda|cuda|Cudnn|Nccl)$test_end" "$logs/$name".*.log)
    result=pass secs=0
    for ((i = 0; i < shards; i++)); do
      if ! read -r rc s <"$logs/$name.$i.rc" 2>/dev/null; then
        result="FAIL (stopped at the stage's deadline)" timed_out=1
        continue
      fi
      [ "$s" -gt "$secs" ] && secs=$s
      if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        result="FAIL (stopped at the stage's deadline)" timed_out=1
      elif [ "$rc" != 0 ] && [ "$result" = pass ]; then
        result="FAIL (exit $rc)"
      fi
    done
    if [ "$result" != pass ]; then
      fail "$group: $name $result; $failed failed (tests/$name.*.log)"
      grep -hE "^\\[  FAILED  \\] $test_end" "$logs/$name".*.log | head -5 | sed 's/^/    /'
    fi
    # A path the binary was built with must not be skipped: its tests are the only GPU evidence for it.
    skip_reasons "$logs/$name".*.log >"$logs/$name.skips"
    if [ "$host_only" = 0 ]; then
      if grep -q "^$name:.*libcudnn" "$here/manifest-needed.txt" 2>/dev/null &&
         grep -qE '^[^ :]*Cudnn[^ :]*:' "$logs/$name.skips"; then
        fail "$group: $name was built with cuDNN attention but skipped its cuDNN tests: $(grep -m1 -E '^[^ :]*Cudnn' "$logs/$name.skips")"
      fi
      if grep -q "^$name:.*libnccl" "$here/manifest-needed.txt" 2>/dev/null &&
         grep -qE '^[^ :]*Nccl[^ :]*:' "$logs/$name.skips"; then
        fail "$group: $name was built with NCCL but skipped its NCCL tests: $(grep -m1 -E '^[^ :]*Nccl' "$logs/$name.skips")"
      fi
    fi
    tp=$((tp + passed)) tf=$((tf + failed)) ts=$((ts + skipped)) tc=$((tc + cuda))
    rows+=("$(printf '%-16s %6s %6s %7s %5s %5s  %s' "$name" "$passed" "$failed" "$skipped" "$cuda" "$secs" "$result")")
    bjson+=("$(printf '%s: {"shards": %s, "passed": %s, "failed": %s, "skipped": %s, "cuda_ran": %s, "seconds": %s, "result": %s}' \
      "$(json_str "$name")" "$shards" "$passed" "$failed" "$skipped" "$cuda" "$secs" "$(json_str "$result")")")
  done <"$logs/$group.plan"
  {
    printf '%-16s %6s %6s %7s %5s %5s  %s\n' "$group" passed failed skipped cuda secs result
    printf '%s\n' "${rows[@]}"
    printf '%-16s %6s %6s %7s %5s\n' total "$tp" "$tf" "$ts" "$tc"
  } >"$res/$group.txt"
  cat "$res/$group.txt"
  # Every skipped test of the group with its reason; skipped.txt gathers the groups.
  while read -r name _ mode; do [ "$mode" != run ] || cat "$logs/$name.skips"; done <"$logs/$group.plan" >"$logs/$group.skips"
  cat "$logs"/*-tests.skips >"$res/skipped.txt" 2>/dev/null
  local no_gpu
  no_gpu=$(grep -cE "$no_gpu_re" "$logs/$group.skips")
  note="$nb binaries: $tp passed, $tf failed, $ts skipped; $tc cuda ran"
  if [ "$host_only" = 0 ]; then
    [ "$tc" -gt 0 ] || fail "$group: no CUDA test ran ($(grep -m1 -E "$no_gpu_re" "$logs/$group.skips"))"
    [ "$no_gpu" = 0 ] || fail "$group: $no_gpu tests skipped for want of a GPU, e.g. $(grep -m1 -E "$no_gpu_re" "$logs/$group.skips")"
  fi
  [ "$timed_out" = 0 ] || status=deadline
  local IFS=,
  tests_json[$group]="{\"passed\": $tp, \"failed\": $tf, \"skipped\": $ts, \"cuda_ran\": $tc, \"skipped_without_gpu\": $no_gpu, \"binaries\": {${bjson[*]}}}"
}
read_kernel-tests() { read_tests kernel-tests; }
read_engine-tests() { read_tests engine-tests; }

# Model FLOPs per token: 6 N (N: the parameters strata train prints) + 12 L d T (attention's scores and
# weighted sum, forward and backward; L layers, d = d_model, T tokens per sequence, from the preset's JSON
# in src/configs/models/). Recomputation (activation checkpointing) is not counted.
flops_per_token() {
  local params=$1 model=$2 seq=$3 f=$here/src/configs/models/$2.json L d
  L=$(sed -n 's/.*"n_layers": *\([0-9]*\).*/\1/p' "$f" 2>/dev/null)
  d=$(sed -n 's/.*"d_model": *\([0-9]*\).*/\1/p' "$f" 2>/dev/null)
  if [ -n "$L" ] && [ -n "$d" ]; then
    awk -v n="$params" -v l="$L" -v d="$d" -v t="$seq" 'BEGIN {printf "%.0f 6N+12LdT (L=%d d=%d T=%d)\n", 6 * n + 12 * l * d * t, l, d, t}'
  else
    awk -v n="$params" 'BEGIN {printf "%.0f 6N\n", 6 * n}'
  fi
}

# read_train NAME: the step lines of train-NAME/train.log, its summary, the aio backend it chose.
read_train() {
  local name=$1 backend config model mb seq steps rc secs
  local dir=$res/train-$name
  read -r backend config model mb seq steps <"$dir/settings" 2>/dev/null || { note="not started"; status=fail; return; }
  read -r rc secs <"$dir/rc" 2>/dev/null || rc=killed secs=
  rm -rf "${nvme_path:?}/$name"
  local losses times ndone run_status=pass
  losses=$(awk '/^step [0-9]+\// {v = $4; if (v !~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) v = "null"  # nan, inf
                                  printf "%s%s", sep, v; sep = ","}' "$dir/train.log" 2>/dev/null)
  times=$(awk '/^step [0-9]+\// {for (i = 1; i < NF; i++) if ($i == "time") {t = $(i + 1); sub("s$", "", t)}
                                  printf "%s%s", sep, t; sep = ","}' "$dir/train.log" 2>/dev/null)
  ndone=$(grep -c '^step [0-9]*/' "$dir/train.log" 2>/dev/null)
  if [ "$rc" = 124 ] || [ "$rc" = 137 ] || [ "$rc" = killed ]; then
    if [ "${ndone:-0}" -ge 3 ]; then
      run_status="partial: $ndone of $steps steps by the deadline" status=partial
    else
      run_status="stopped at the deadline after $ndone of $steps steps" status=deadline
    fi
  elif [ "$rc" != 0 ]; then
    run_status="exit $rc: $(grep -m1 -iE 'error' "$dir/train.log" | cut -c1-240)" status=fail
  elif [ "$ndone" != "$steps" ]; then
    run_status="$ndone of $steps steps printed" status=fail
  fi
  [ "$status" = pass ] || [ "$status" = partial ] || fail "$current: $run_status (train-$name/train.log)"
  # Steady state: the means over steps 2.. (step 1 records the trace) of tokens/s and the step's split.
  local tps_steady st fw bw op wt tps params aio flops formula tflops
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
          else print "" }' "$dir/train.log" 2>/dev/null)
  tps=$(sed -n 's/^summary: .* \([0-9.]*\) tokens\/s$/\1/p' "$dir/train.log" 2>/dev/null)
  params=$(sed -n 's/^train: [^,]*, \([0-9]*\) parameters.*/\1/p' "$dir/train.log" 2>/dev/null | head -1)
  aio=$(sed -n 's/.*aio backend: \([a-z_]*\).*/\1/p' "$dir/train.log" 2>/dev/null | head -1)
  flops=null formula='' tflops=null
  if [ -n "$params" ]; then
    read -r flops formula < <(flops_per_token "$params" "$model" "$seq")
    [ -z "$tps_steady" ] || tflops=$(awk -v a="$tps_steady" -v f="$flops" 'BEGIN {printf "%.1f", a * f / 1e12}')
  fi
  # The step-time model's prediction against the median of the steps after the first two (the summary's
  # "step time   predicted Xs, measured Ys" line; bench/RESULTS.md has what was predicted for an H100).
  local predicted measured
  read -r predicted measured < <(sed -n 's/^  step time   predicted \([0-9.]*\)s, measured \([0-9.]*\)s.*/\1 \2/p' \
    "$dir/train.log" 2>/dev/null | head -1)
  note="$model on $backend, $ndone/$steps steps"
  [ -z "$tps_steady" ] || note="$note, $tps_steady tok/s steady, $tflops TFLOP/s by $formula"
  [ -z "$predicted" ] || note="$note, step predicted ${predicted}s against ${measured}s measured"
  [ -z "$aio" ] || note="$note, aio $aio"
  [ "$status" = pass ] || note="$note; $run_status"
  train_json[$name]=$(printf '{"status": %s, "backend": %s, "config": %s, "model": %s, "parameters": %s, "micro_batch": %s, "seq_len": %s, "steps": %s, "steps_done": %s, "seconds": %s, "aio_backend": %s, "tokens_per_s": %s, "tokens_per_s_steady": %s, "flops_per_token": %s, "flops_formula": %s, "tflops_steady": %s, "step_time_steady": {"total": %s, "forward": %s, "backward": %s, "optimizer": %s, "wait": %s}, "step_time_predicted": %s, "step_time_measured_median": %s, "losses": [%s], "step_seconds": [%s]}' \
    "$(json_str "$run_status")" "$(json_str "$backend")" "$(json_str "$config")" "$(json_str "$model")" \
    "$(json_num "$params")" "$mb" "$seq" "$steps" "${ndone:-0}" "$(json_num "$secs")" \
    "$([ -n "$aio" ] && json_str "$aio" || echo null)" "$(json_num "$tps")" "$(json_num "$tps_steady")" \
    "$(json_num "$flops")" "$(json_str "$formula")" "$(json_num "$tflops")" "$(json_num "$st")" "$(json_num "$fw")" \
    "$(json_num "$bw")" "$(json_num "$op")" "$(json_num "$wt")" "$(json_num "$predicted")" "$(json_num "$measured")" \
    "$losses" "$times")
}
read_train-cpu() { read_train cpu; }
read_train-nvme() {
  read_train nvme
  grep -q 'aio backend' "$res/train-nvme/train.log" 2>/dev/null ||
    { [ "$status" != pass ] || fail "train-nvme: no \"aio backend: ...\" line in train-nvme/train.log"; }
}

read_bench() {
  local rc line
  read -r rc _ <"$res/step_bench.rc" 2>/dev/null || rc=killed
  line=$(grep '^{' "$res/step_bench.log" 2>/dev/null | tail -1)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    bench_json=$line
    note="$(grep -cE '^(none|cpu|nvme)' "$res/step_bench.log") placement rows against the compute-only step (step_bench.log)"
  else
    bench_json=$(printf '{"status": %s}' "$(json_str "exit $rc")")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ] || [ "$rc" = killed ]; then status=deadline; fi
    note="exit $rc"
    fail "bench: step_bench exited $rc (step_bench.log): $(grep -m1 -i error "$res/step_bench.log" | cut -c1-200)"
  fi
}

read_compare() {
  local a=$res/train-compare-a/train.log b=$res/train-compare-b/train.log la lb verdict max n
  la=$(sed -n 's/^step [0-9]*\/[0-9]* loss \([^ ]*\) .*/\1/p' "$a" 2>/dev/null | tr '\n' ' ')
  lb=$(sed -n 's/^step [0-9]*\/[0-9]* loss \([^ ]*\) .*/\1/p' "$b" 2>/dev/null | tr '\n' ' ')
  verdict=$(awk -v a="$la" -v b="$lb" 'BEGIN {
      n = split(a, x, " "); m = split(b, y, " ");
      if (n == 0 || n != m) { printf "steps %d %d", n, m; exit }
      d = 0; for (i = 1; i <= n; i++) { e = x[i] - y[i]; if (e < 0) e = -e; if (e > d) d = e }
      printf "max %.6g %d", d, n }')
  read -r _ max n <<<"$verdict"
  case $verdict in
    max*)
      compare_json=$(printf '{"runs": [%s, %s], "steps": %s, "max_abs_diff": %s, "bound": 0.02, "pass": %s}' \
        "$(json_str "$(cat "$res/train-compare-a/settings")")" "$(json_str "$(cat "$res/train-compare-b/settings")")" \
        "$n" "$max" "$(awk -v d="$max" 'BEGIN {print (d <= 0.02) ? "true" : "false"}')")
      note="largest loss difference over $n steps: $max (bound 0.02)"
      awk -v d="$max" 'BEGIN {exit !(d > 0.02)}' && fail "compare: losses differ by $max (> 0.02)"
      ;;
    *)
      compare_json=$(printf '{"pass": false, "why": %s}' "$(json_str "step counts differ: $verdict")")
      note="cannot compare: $verdict"
      [ "$killed" = 1 ] && status=deadline
      fail "compare: the two runs' losses cannot be compared ($verdict; train-compare-*/train.log)"
      ;;
  esac
}

# ---------------------------------------------------------------------------------------------------------
# summary.txt, results.json and the archive.

mode_name() { [ "$host_only" = 1 ] && echo host-only || echo gpu; }
# A stage overran when it took more than its deadline and the 10 s its processes get to end.
overran() { [ "${st_secs[$1]}" -gt $((${st_deadline[$1]} + 10)) ] && echo true || echo false; }

write_summary() {
  local final=$1 s n=0 d lines
  echo "Strata GPU bundle $bundle_commit (built $bundle_date, CUDA $bundle_cuda, glibc floor $glibc_floor): $(mode_name) run on $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "GPU: $machine_gpu, driver $machine_driver; $(nproc) CPUs, glibc $glibc_here; $(elapsed) s of a ${budget} s budget"
  echo "CUDA libraries, in the order found (libraries.txt: soname, folder, file, version):"
  # One line per folder and version: the sonames, the version (the real file's name where the soname is
  # a link to it, else the wheel's or the toolkit's), the folder.
  lines=$(awk '$2 == "-" {miss = miss " " $1; next}
               {v = $3 != $1 ? $3 : ($4 != "-" ? $4 : "version-unknown"); key = $2 " " v
                if (!(key in libs)) order[++k] = key; libs[key] = libs[key] " " $1}
               END {for (i = 1; i <= k; i++) {split(order[i], kv, " "); print "  " substr(libs[order[i]], 2) "  " kv[2] "  " kv[1]}
                    if (miss != "") print "  not found:" miss}' "$res/libraries.txt")
  echo "${lines:-  none}"
  printf '%-13s %-8s %5s %5s  %s\n' stage result secs limit note
  for s in "${stage_order[@]}"; do
    printf '%-13s %-8s %5s %5s  %s\n' "$s" "${st_status[$s]}" "${st_secs[$s]}" "${st_deadline[$s]}" "${st_note[$s]}" | cut -c1-200
  done
  for s in kernel-tests engine-tests; do
    [ -f "$res/$s.txt" ] || continue
    grep -E 'FAIL' "$res/$s.txt" | head -4 | sed "s/^/  $s: /"
  done
  echo
  if [ "$final" = running ]; then
    echo "RUNNING: ${#failures[@]} failures so far"
  elif [ ${#failures[@]} = 0 ]; then
    echo PASS
  fi
  for d in "${failures[@]}"; do
    n=$((n + 1))
    [ "$n" -le 10 ] && echo "FAIL: $d" | cut -c1-300
  done
  [ "$n" -le 10 ] || echo "... $((n - 10)) more failures in results.json"
  echo "Details: results.tar.gz (strata-results/: run.log, stages/<stage>.out, tests/, train-*/, ...)"
}

write_results() {
  local final=$1 s d f v first=1
  {
    printf '{\n  "schema": "strata.gpu-bundle", "version": 2,\n'
    printf '  "mode": %s, "status": %s, "seconds": %s, "budget": %s,\n' "$(json_str "$(mode_name)")" \
      "$(json_str "$final")" "$(elapsed)" "$budget"
    printf '  "bundle": {"commit": %s, "built": %s, "cuda": %s, "glibc_floor": %s},\n' "$(json_str "$bundle_commit")" \
      "$(json_str "$bundle_date")" "$(json_str "$bundle_cuda")" "$(json_str "$glibc_floor")"
    printf '  "machine": {"gpu": %s, "driver": %s, "cpus": %s, "glibc": %s},\n' "$(json_str "$machine_gpu")" \
      "$(json_str "$machine_driver")" "$(nproc)" "$(json_str "$glibc_here")"
    printf '  "libraries": ['
    while read -r s d f v; do
      [ "$first" = 1 ] || printf ', '
      first=0
      if [ "$d" = - ]; then d=null f=null; else d=$(json_str "$d") f=$(json_str "$f"); fi
      if [ "$v" = - ]; then v=null; else v=$(json_str "$v"); fi
      printf '{"soname": %s, "folder": %s, "file": %s, "version": %s}' "$(json_str "$s")" "$d" "$f" "$v"
    done <"$res/libraries.txt"
    printf '],\n  "stages": ['
    first=1
    for s in "${stage_order[@]}"; do
      [ "$first" = 1 ] || printf ','
      first=0
      printf '\n    {"name": %s, "status": %s, "seconds": %s, "deadline": %s, "overran": %s, "note": %s}' \
        "$(json_str "$s")" "$(json_str "${st_status[$s]}")" "${st_secs[$s]}" "${st_deadline[$s]}" \
        "$(overran "$s")" "$(json_str "${st_note[$s]}")"
    done
    printf '],\n  "failures": ['
    first=1
    for f in "${failures[@]}"; do
      [ "$first" = 1 ] || printf ', '
      first=0
      json_str "$f"
    done
    printf '],\n  "tests": {'
    first=1
    for s in kernel-tests engine-tests; do
      [ -n "${tests_json[$s]:-}" ] || continue
      [ "$first" = 1 ] || printf ','
      first=0
      printf '\n    %s: %s' "$(json_str "$s")" "${tests_json[$s]}"
    done
    printf '},\n  "train": {'
    first=1
    for s in cpu nvme; do
      [ -n "${train_json[$s]:-}" ] || continue
      [ "$first" = 1 ] || printf ','
      first=0
      printf '\n    %s: %s' "$(json_str "$s")" "${train_json[$s]}"
    done
    printf '},\n  "loss_compare": %s,\n  "step_bench": %s\n}\n' "$compare_json" "$bench_json"
  }
}

# pack STATUS: summary.txt and results.json into the results folder and OUTDIR, then the one archive.
pack() {
  local final=$1
  write_summary "$final" >"$res/summary.txt"
  write_results "$final" >"$res/results.json"
  cp "$res/summary.txt" "$out/.summary.txt.tmp" && mv "$out/.summary.txt.tmp" "$out/summary.txt"
  cp "$res/results.json" "$out/.results.json.tmp" && mv "$out/.results.json.tmp" "$out/results.json"
  tar -C "$work" -czf "$out/.results.tar.gz.tmp" strata-results 2>/dev/null
  # A returned file holds at most 16 MiB: cut logs over 1 MiB to their first and last 256 KiB.
  if [ "$(stat -c %s "$out/.results.tar.gz.tmp")" -gt $((15 * 1048576)) ]; then
    local f
    while IFS= read -r f; do
      { head -c 262144 "$f"; printf '\n[... cut by run.sh: the archive must stay under 16 MiB ...]\n'; tail -c 262144 "$f"; } \
        >"$f.cut" && mv "$f.cut" "$f"
    done < <(find "$res" -type f -size +1M)
    tar -C "$work" -czf "$out/.results.tar.gz.tmp" strata-results 2>/dev/null
  fi
  mv "$out/.results.tar.gz.tmp" "$out/results.tar.gz"
}

on_signal() {
  echo "run.sh: stopped by a signal; packing what there is"
  [ -z "$current_sid" ] || kill_session "$current_sid"
  fail "run.sh was stopped by a signal $(elapsed) s into the run"
  pack fail
  exit 1
}

main() {
  trap '' PIPE
  trap on_signal INT TERM
  echo "strata GPU bundle $bundle_commit (built $bundle_date), $(mode_name) run; budget ${budget} s; results in $out"
  # Pinned host memory beyond RLIMIT_MEMLOCK stays unlocked (strata report says so); lift it where allowed.
  ulimit -l unlimited 2>/dev/null || echo "RLIMIT_MEMLOCK stays $(ulimit -l) KiB (ulimit -l unlimited refused)"
  local t0=$SECONDS
  set_library_path "$res/libraries.txt"
  echo "libraries found in $((SECONDS - t0)) s; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local s secs eff left_s reserve=5 t
  for s in "${timeline[@]}"; do
    [[ "$selected" == *" $s "* ]] || continue
    current=$s status=pass note='' killed=0
    left_s=$((budget - $(elapsed) - reserve))
    eff=${deadline[$s]}
    [ "$left_s" -ge "$eff" ] || eff=$left_s
    stage_order+=("$s")
    st_deadline[$s]=$((eff > 0 ? eff : 0)) st_secs[$s]=0
    if [ "$gpu_ok" = 0 ] && [ "$host_only" = 0 ] && [[ "$gpu_stages" == *" $s "* ]]; then
      status=skipped note="no usable CUDA device (probe)"
    elif [ "$eff" -lt "${need[$s]}" ]; then
      status=skipped note="needs ${need[$s]} s, $((left_s > 0 ? left_s : 0)) s left of the ${budget} s budget"
    else
      echo
      echo "=== $s (deadline ${eff} s, $(elapsed) s into the run)"
      t=$(date +%s)
      run_killable "$s" "$eff"
      st_secs[$s]=$(($(date +%s) - t))
      # The reader decides what a deadline means (a training run with 3 steps is partial, no failure).
      "read_$s" >>"$res/stages/$s.out" 2>&1
      [ "$killed" = 0 ] || [ "$status" != pass ] || status=deadline
      if [ "$status" = deadline ] && ! stage_failed "$s"; then fail "$s: stopped at its deadline of ${eff} s"; fi
      [ "$status" != pass ] || ! stage_failed "$s" || status=fail
    fi
    st_status[$s]=$status st_note[$s]=$note
    printf '%-13s %-8s %4s s of %4s  %s\n' "$s" "$status" "${st_secs[$s]}" "${st_deadline[$s]}" "$note"
    pack running
  done
  local final=pass
  [ ${#failures[@]} = 0 ] || final=fail
  pack "$final"
  echo
  echo "=== summary ($out: results.tar.gz, summary.txt, results.json)"
  cat "$out/summary.txt"
  [ "$final" = pass ]
}

main > >(tee "$res/run.log") 2>&1
rc=$?
wait
exit "$rc"
