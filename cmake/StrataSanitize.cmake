# Sanitizer and fuzzer builds (scripts/ci-sanitize.sh runs them in CI; docs/testing.md says how).
#
# STRATA_SANITIZE: a comma-separated list passed to -fsanitize= for every C and C++ target of the tree,
#   libraries, tests, tools and benchmarks alike (instrumenting only some objects hides bugs and, for TSan,
#   reports false races). Empty (the default) builds without. Supported: "address,undefined" (ASan + UBSan,
#   the whole suite runs under it) and "thread" (TSan, the threaded suites). UBSan is fatal
#   (-fno-sanitize-recover=all): a report fails the test instead of scrolling by. CUDA sources are never
#   instrumented, so a sanitizer build must be CPU-only (-DSTRATA_CUDA=OFF).
# STRATA_FUZZ: builds the libFuzzer targets under fuzz/ (clang only). Every library is compiled with
#   -fsanitize=fuzzer-no-link so that libFuzzer sees coverage in the parsers, and each target links
#   -fsanitize=fuzzer; combine it with STRATA_SANITIZE=address,undefined.
set(STRATA_SANITIZE "" CACHE STRING "Sanitizers for every target: empty, address,undefined or thread")
option(STRATA_FUZZ "Build the libFuzzer targets under fuzz/ (clang only)" OFF)

if(STRATA_SANITIZE OR STRATA_FUZZ)
  if(STRATA_WITH_CUDA)
    message(FATAL_ERROR "STRATA_SANITIZE / STRATA_FUZZ instrument host code only; configure with "
                        "-DSTRATA_CUDA=OFF")
  endif()
endif()

set(strata_sanitize_flags)
# STRATA_WITHOUT_UBSAN: the option that takes UBSan off one target or file of a tree that has it (test code,
# Note [Test code flags]; cpu_optim's Highway kernels); empty in every other tree.
set(STRATA_WITHOUT_UBSAN "")
if(STRATA_SANITIZE)
  string(REPLACE "," ";" strata_sanitizers "${STRATA_SANITIZE}")
  foreach(s ${strata_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "STRATA_SANITIZE: unknown sanitizer '${s}' (use address,undefined or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST strata_sanitizers AND ("address" IN_LIST strata_sanitizers OR "leak" IN_LIST strata_sanitizers))
    message(FATAL_ERROR "STRATA_SANITIZE: thread cannot be combined with address or leak; build two trees")
  endif()
  list(APPEND strata_sanitize_flags -fsanitize=${STRATA_SANITIZE} -fno-sanitize-recover=all
       -fno-omit-frame-pointer)
  # UBSan's null check is left out: a null dereference is already a fatal ASan report (SEGV on address
  # 0x0, with its stack) in the same tree, and the check is the dearest to compile (g++ 12,
  # zero3/engine.cpp at -O1 -g1: 24.7 s with it, 15.7 s without). UBSan keeps alignment, bounds, shifts,
  # overflow, vptr and the rest.
  if("undefined" IN_LIST strata_sanitizers)
    list(APPEND strata_sanitize_flags -fno-sanitize=null)
    set(STRATA_WITHOUT_UBSAN -fno-sanitize=undefined)
  endif()
endif()
if(STRATA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "STRATA_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: configure with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  list(APPEND strata_sanitize_flags -fsanitize=fuzzer-no-link)
endif()
if(strata_sanitize_flags)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${strata_sanitize_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${strata_sanitize_flags}>")
  message(STATUS "Strata sanitizers: ${strata_sanitize_flags}")
endif()

# strata_fuzz_uninstrumented(TARGET): in the fuzz tree (STRATA_FUZZ), compiles a library that the fuzz
# targets link but never drive (no fuzzer input reaches its code: the optimizers, the compute kernels, the
# communicators, the prefetcher) without sanitizers or coverage. Coverage there would only add edges no
# input can reach, and clang's ASan + UBSan instrumentation of such code is most of the tree's build time
# (cpu_optim/lion.cpp: 32 s plain, 200 s instrumented). The readers the fuzzers drive (config, model,
# zero3's checkpoint, memprof) and what they call (core, tiering, nvme) stay instrumented. No effect in
# any other tree.
function(strata_fuzz_uninstrumented tgt)
  if(STRATA_FUZZ)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize=all>)
  endif()
endfunction()
