#!/usr/bin/env bash
# The sanitizer and fuzzer stages of CI (.ci/run runs them after scripts/test.sh). Each stage has its own
# CPU-only build folder and fails on the first report; docs/testing.md says what each one covers.
#
#   asan  build-asan/  ASan + UBSan (fatal), the whole ctest suite, multi-rank tests included, but for the
#                      CPU optimizers' float64 accuracy sweep (see stage_asan)
#   tsan  build-tsan/  TSan, the threaded suites: device streams, tier manager, NVMe engine, prefetcher,
#                      engine (test_core, test_tiering, test_nvme, test_prefetch, test_zero3, test_zero3_parts)
#   fuzz  build-fuzz/  clang + libFuzzer + ASan/UBSan: every target under fuzz/ for FUZZ_RUNS inputs from a
#                      fixed seed on its committed corpus (fuzz/corpus/<target>/); new inputs go to
#                      build-fuzz/corpus/, which starts empty each time
#
# Usage: scripts/ci-sanitize.sh [asan|tsan|fuzz ...]     (no argument: all three, in that order)
# JOBS: build and ctest parallelism (default: all cores). FUZZ_RUNS: inputs per fuzz target (default 150000,
# about 30-60 s each here); FUZZ_SECONDS: a cap on each target's time (default 120); FUZZ_SEED (default 1).
# Each stage prints its wall time; the stages build incrementally, so a second run only rebuilds changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-$(nproc)}
fuzz_runs=${FUZZ_RUNS:-150000}
fuzz_seconds=${FUZZ_SECONDS:-120}
fuzz_seed=${FUZZ_SEED:-1}
supp=$root/scripts/sanitizers
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

# Sanitizer runtime options. halt_on_error: the first report ends the process (non-zero exit), so the test
# fails at the bug rather than later. LSan's suppressions cover only uninstrumented libraries
# (each entry says why); our own code is never suppressed. TSan needs none: oneTBB, the one uninstrumented
# library that hands our code between threads, runs single-threaded in the tsan tree (Note [TSan and
# oneTBB], tests/common/tbb_serial_under_tsan.cpp).
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
# OpenBLAS's own threads are uninstrumented spin-waiting pthreads; one thread keeps matrix products in the
# calling (instrumented) thread.
export OPENBLAS_NUM_THREADS=1

# Every sanitizer report ends with this line. Tests checked by PASS_REGULAR_EXPRESSION ignore the exit
# code, so the ctest log is searched as well.
report_re='SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|ThreadSanitizer)|runtime error: '

# configure DIR cmake-args...: configures a CPU-only Release-like tree (-O1 -g1: line numbers in reports,
# optimised enough that the suite runs in minutes) once; later runs reuse it.
configure() {
  local dir=$1
  shift
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$dir" "${generator[@]}" -DSTRATA_CUDA=OFF -DSTRATA_BUILD_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
      "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" "$@"
  fi
}

# check_log DIR [LOG]: fails when ctest's log (default: the last run's) holds a sanitizer report.
check_log() {
  local dir=$1 log=${2:-$1/Testing/Temporary/LastTest.log}
  if [ -f "$log" ] && grep -Eq "$report_re" "$log"; then
    echo "ci-sanitize: sanitizer report(s) in $log:" >&2
    grep -En -B2 -A20 "$report_re" "$log" | head -200 >&2
    return 1
  fi
}

stage_asan() {
  local dir=$root/build-asan
  configure "$dir" -DSTRATA_SANITIZE=address,undefined
  cmake --build "$dir" --parallel "$jobs"
  # Two passes, because of Open MPI (labels comm, ranks, launch: the tests that start MPI): its leaks are
  # suppressed by library (scripts/sanitizers/lsan.supp), which needs full stacks through its dlopen'ed
  # components, i.e. the slow unwinder on every malloc; the rest of the suite keeps the fast one.
  # Left out: the float64 accuracy sweep of the CPU optimizers (AllDtypes/Accuracy), two fifths of the
  # suite's time under ASan (408 of 1086 s) in test code comparing numbers. The memory it touches is
  # touched here by the exactness tests (every optimizer, dtype, target and output, sizes 0 to 1000,
  # misaligned) and ThreadCount (2^20 + 3 elements, misaligned, 1 to 5 threads); test.sh runs the sweep.
  local mpi='^(comm|ranks|launch)$' failed=0
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$jobs" -LE "$mpi" \
    -E '^AllDtypes/Accuracy[.]' || failed=1
  cp "$dir/Testing/Temporary/LastTest.log" "$dir/Testing/Temporary/LastTest-nompi.log" 2>/dev/null || true
  check_log "$dir" "$dir/Testing/Temporary/LastTest-nompi.log" || failed=1
  # The launcher's signal tests (launch_signal_*) are left out of it: they time their signals against
  # steps of about 5 s in an optimised build, and the launcher's code they run is the same unsanitized.
  ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0:malloc_context_size=30" \
    ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$jobs" -L "$mpi" -E '^launch_signal_' ||
    failed=1
  check_log "$dir" || failed=1
  return $failed
}

tsan_targets=(test_core test_tiering test_nvme test_prefetch test_zero3 test_zero3_parts)
stage_tsan() {
  local dir=$root/build-tsan
  configure "$dir" -DSTRATA_SANITIZE=thread
  cmake --build "$dir" --parallel "$jobs" --target "${tsan_targets[@]}"
  # Each GoogleTest binary labels its tests with its name (tests/CMakeLists.txt); the others were not built.
  # Left out: the device-cap sweeps (DeviceRoom, Caps/DeviceRoom), which train the 10M preset at a dozen
  # caps — compute, not threading, ~25 min under TSan on two cores; the asan stage runs them.
  local labels
  labels=$(IFS='|'; echo "${tsan_targets[*]}")
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$jobs" -L "^($labels)\$" \
    -E '^(Caps/)?DeviceRoom[.]'
  check_log "$dir"
}

fuzz_targets=(config safetensors checkpoint token_file memprof_trace)
stage_fuzz() {
  local dir=$root/build-fuzz
  configure "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON \
    -DSTRATA_SANITIZE=address,undefined -DSTRATA_BUILD_TESTS=OFF
  cmake --build "$dir" --parallel "$jobs" --target "${fuzz_targets[@]/%/_fuzz}"
  # The targets run side by side, $jobs at a time (each libFuzzer process is single-threaded); each one's
  # work is fixed by its seed and input count, so running them together changes nothing but the time.
  local t failed=() running=0
  for t in "${fuzz_targets[@]}"; do
    # Note [Deterministic fuzzing in CI]: a fixed seed, a fixed number of inputs and a corpus folder that
    # starts empty make the stage do the same work on every run of the same tree, so CI passes or fails
    # with the code, not with luck; new seeds are for fuzzing longer by hand (docs/testing.md).
    rm -rf "$dir/corpus/$t" "$dir/artifacts/$t.status"
    mkdir -p "$dir/corpus/$t" "$dir/artifacts"
    echo "ci-sanitize: fuzzing $t, $fuzz_runs inputs from seed $fuzz_seed (at most ${fuzz_seconds}s; seeds: fuzz/corpus/$t)"
    # The first folder receives new inputs; the committed corpus is only read. -timeout: an input that
    # takes longer than 10 s is a finding (a hang); -rss_limit_mb: so is one that needs more than 2 GiB.
    (
      rc=0
      "$dir/fuzz/${t}_fuzz" "$dir/corpus/$t" "$root/fuzz/corpus/$t" -seed="$fuzz_seed" -runs="$fuzz_runs" \
        -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$dir/artifacts/$t-" >"$dir/artifacts/$t.log" 2>&1 || rc=$?
      echo "$rc" >"$dir/artifacts/$t.status"
    ) &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
  wait
  for t in "${fuzz_targets[@]}"; do
    if [ "$(cat "$dir/artifacts/$t.status" 2>/dev/null)" != 0 ]; then
      failed+=("$t")
      echo "ci-sanitize: fuzz target $t found a problem (log $dir/artifacts/$t.log):" >&2
      grep -Ev '^#[0-9]+|^INFO: |^MERGE' "$dir/artifacts/$t.log" | tail -60 >&2
      echo "ci-sanitize: reproduce with $dir/fuzz/${t}_fuzz $dir/artifacts/$t-<crash file>; add the input" \
        "to fuzz/corpus/$t/ and a regression test to tests/" >&2
    else
      echo "ci-sanitize: $t: $(grep -E '^Done [0-9]+ runs' "$dir/artifacts/$t.log" | tail -1)"
    fi
  done
  [ ${#failed[@]} -eq 0 ] || {
    echo "ci-sanitize: fuzz findings in: ${failed[*]}" >&2
    return 1
  }
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan fuzz)
for s in "${stages[@]}"; do
  case $s in
    asan | tsan | fuzz) ;;
    *)
      echo "ci-sanitize: unknown stage '$s' (asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
done
for s in "${stages[@]}"; do
  start=$SECONDS
  echo "ci-sanitize: === stage $s ==="
  "stage_$s"
  echo "ci-sanitize: stage $s passed in $((SECONDS - start)) s"
done
