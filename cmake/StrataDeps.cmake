# Every third-party dependency comes from a Debian package (scripts/install-deps.sh installs them all).
# A missing one fails configure naming the package to install.
find_package(PkgConfig QUIET)

function(strata_missing what pkg)
  message(FATAL_ERROR "Strata needs ${what}, which was not found. Install the Debian package '${pkg}' "
                      "(sudo apt-get install ${pkg}), or run scripts/install-deps.sh to install everything.")
endfunction()

find_package(Threads REQUIRED)

if(NOT PKG_CONFIG_FOUND)
  strata_missing("pkg-config" "pkg-config")
endif()

pkg_check_modules(URING QUIET IMPORTED_TARGET liburing)
if(NOT URING_FOUND)
  strata_missing("liburing" "liburing-dev")
endif()

find_path(AIO_INCLUDE_DIR libaio.h)
find_library(AIO_LIBRARY aio)
if(NOT AIO_INCLUDE_DIR OR NOT AIO_LIBRARY)
  strata_missing("libaio" "libaio-dev")
endif()
add_library(strata_dep_aio INTERFACE)
target_include_directories(strata_dep_aio INTERFACE ${AIO_INCLUDE_DIR})
target_link_libraries(strata_dep_aio INTERFACE ${AIO_LIBRARY})

pkg_check_modules(HWLOC QUIET IMPORTED_TARGET hwloc)
if(NOT HWLOC_FOUND)
  strata_missing("hwloc" "libhwloc-dev")
endif()

find_package(TBB QUIET CONFIG)
if(NOT TBB_FOUND)
  strata_missing("oneTBB" "libtbb-dev")
endif()

find_package(hwy QUIET CONFIG)
if(NOT hwy_FOUND)
  pkg_check_modules(HWY QUIET IMPORTED_TARGET libhwy)
  if(NOT HWY_FOUND)
    strata_missing("Google Highway" "libhwy-dev")
  endif()
  add_library(hwy::hwy ALIAS PkgConfig::HWY)
endif()

find_package(nlohmann_json 3.2 QUIET CONFIG)
if(NOT nlohmann_json_FOUND)
  strata_missing("nlohmann-json" "nlohmann-json3-dev")
endif()

find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT CLI11_INCLUDE_DIR)
    strata_missing("CLI11" "libcli11-dev")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

find_package(BLAS QUIET)
find_path(OPENBLAS_CBLAS_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
find_library(OPENBLAS_LIBRARY NAMES openblas PATH_SUFFIXES openblas-pthread)
if(NOT OPENBLAS_LIBRARY OR NOT OPENBLAS_CBLAS_DIR)
  strata_missing("OpenBLAS" "libopenblas-dev")
endif()
add_library(strata_dep_openblas INTERFACE)
target_include_directories(strata_dep_openblas INTERFACE ${OPENBLAS_CBLAS_DIR})
target_link_libraries(strata_dep_openblas INTERFACE ${OPENBLAS_LIBRARY})

# oneDNN (Debian's libdnnl-dev): the host backend's bf16 matrix products (kernels/cpu/linear_bf16.cpp) on
# AMX / AVX-512 BF16. Optional: without it (or under a sanitizer, whose runtime does not follow oneDNN's JIT
# code and OpenMP threads) the same bf16-rounded products run through OpenBLAS.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY NAMES dnnl)
# Debian's oneDNN runs its threads on OpenMP (libgomp); Strata sizes that team (omp_set_num_threads) and
# runs no OpenMP code of its own.
find_library(GOMP_LIBRARY NAMES gomp libgomp.so.1)
add_library(strata_dep_dnnl INTERFACE)
if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY AND GOMP_LIBRARY AND NOT STRATA_SANITIZE)
  target_include_directories(strata_dep_dnnl INTERFACE ${DNNL_INCLUDE_DIR})
  target_link_libraries(strata_dep_dnnl INTERFACE ${DNNL_LIBRARY} ${GOMP_LIBRARY})
  target_compile_definitions(strata_dep_dnnl INTERFACE STRATA_WITH_DNNL=1)
  set(STRATA_WITH_DNNL ON)
  message(STATUS "oneDNN: ${DNNL_LIBRARY} (bf16 matrix products on the host backend)")
else()
  message(STATUS "oneDNN: off (bf16 matrix products through OpenBLAS; scripts/install-deps.sh installs libdnnl-dev)")
endif()

find_package(MPI QUIET COMPONENTS C)
if(NOT MPI_C_FOUND)
  strata_missing("OpenMPI" "libopenmpi-dev")
endif()

if(STRATA_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    strata_missing("GoogleTest" "libgtest-dev")
  endif()
  include(GoogleTest)
endif()
if(STRATA_BUILD_BENCH)
  find_package(benchmark QUIET CONFIG)
  if(NOT benchmark_FOUND)
    strata_missing("Google Benchmark" "libbenchmark-dev")
  endif()
endif()
