# Decide whether the cuDNN fused attention path (kernels/cuda/attention_cudnn.cpp) is built. Included by
# StrataCuda.cmake once the cuda backend is on. Sets STRATA_WITH_CUDNN and, when on, the INTERFACE target
# strata_dep_cudnn (the cuDNN frontend's headers, cuDNN 9 and NVRTC, which the frontend calls).
#
# STRATA_CUDNN: AUTO (default) builds the path when the frontend headers and cuDNN 9 are found, ON requires
# them, OFF never builds it. Without the path, attention runs on kernels/cuda's own kernel.
# STRATA_CUDNN_FRONTEND_INCLUDE_DIR: where cudnn_frontend.h is; scripts/install-deps.sh fetches the pinned
# version into deps/cudnn-frontend/include (the default).
set(STRATA_CUDNN "AUTO" CACHE STRING "Build the cuDNN fused attention path: AUTO, ON or OFF")
set_property(CACHE STRATA_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(STRATA_CUDNN_FRONTEND_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/deps/cudnn-frontend/include"
    CACHE PATH "cuDNN frontend headers (scripts/install-deps.sh fetches them here)")

set(STRATA_WITH_CUDNN OFF)
set(strata_cudnn_why "")
if(STRATA_CUDNN STREQUAL "OFF")
  set(strata_cudnn_why "STRATA_CUDNN=OFF")
else()
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  set(strata_cudnn_major 0)
  if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
    file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" strata_cudnn_version_lines
         REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    foreach(part MAJOR MINOR PATCHLEVEL)
      string(REGEX MATCH "CUDNN_${part} ([0-9]+)" _ "${strata_cudnn_version_lines}")
      set(strata_cudnn_${part} "${CMAKE_MATCH_1}")
    endforeach()
    set(strata_cudnn_major "${strata_cudnn_MAJOR}")
  endif()
  set(strata_cudnn_fe_header "${STRATA_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  if(NOT EXISTS "${strata_cudnn_fe_header}")
    string(CONCAT strata_cudnn_why "the cuDNN frontend headers are not in ${STRATA_CUDNN_FRONTEND_INCLUDE_DIR} "
                         "(run scripts/install-deps.sh --cudnn-frontend, or set STRATA_CUDNN_FRONTEND_INCLUDE_DIR)")
  elseif(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    string(CONCAT strata_cudnn_why "cuDNN (cudnn.h, libcudnn.so) was not found beside the CUDA toolkit "
                         "(${CUDAToolkit_INCLUDE_DIRS}, ${CUDAToolkit_LIBRARY_DIR}); install cuDNN 9 for CUDA 13")
  elseif(strata_cudnn_major LESS 9)
    set(strata_cudnn_why "cuDNN ${strata_cudnn_major} at ${CUDNN_INCLUDE_DIR} is older than 9")
  elseif(NOT TARGET CUDA::nvrtc)
    set(strata_cudnn_why "NVRTC (which the cuDNN frontend calls) was not found in the CUDA toolkit")
  else()
    file(STRINGS "${strata_cudnn_fe_header}" strata_cudnn_fe_lines
         REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "CUDNN_FRONTEND_${part}_VERSION ([0-9]+)" _ "${strata_cudnn_fe_lines}")
      set(strata_cudnn_fe_${part} "${CMAKE_MATCH_1}")
    endforeach()
    set(STRATA_WITH_CUDNN ON)
  endif()
endif()

if(STRATA_WITH_CUDNN)
  add_library(strata_dep_cudnn INTERFACE)
  # SYSTEM: the frontend's headers are not held to our -Wall -Wextra.
  target_include_directories(strata_dep_cudnn SYSTEM INTERFACE ${STRATA_CUDNN_FRONTEND_INCLUDE_DIR}
                                                               ${CUDNN_INCLUDE_DIR})
  # SKIP_JSON_LIB: no graph serialisation, so the frontend's bundled nlohmann::json stays out of the
  # binaries (the config module links the system one).
  target_compile_definitions(strata_dep_cudnn INTERFACE STRATA_WITH_CUDNN CUDNN_FRONTEND_SKIP_JSON_LIB)
  target_link_libraries(strata_dep_cudnn INTERFACE ${CUDNN_LIBRARY} CUDA::nvrtc CUDA::cudart)
  message(STATUS "Strata cuDNN fused attention: ON (cuDNN frontend "
                 "${strata_cudnn_fe_MAJOR}.${strata_cudnn_fe_MINOR}.${strata_cudnn_fe_PATCH} at "
                 "${STRATA_CUDNN_FRONTEND_INCLUDE_DIR}; cuDNN "
                 "${strata_cudnn_MAJOR}.${strata_cudnn_MINOR}.${strata_cudnn_PATCHLEVEL}: ${CUDNN_LIBRARY})")
elseif(STRATA_CUDNN STREQUAL "ON")
  message(FATAL_ERROR "STRATA_CUDNN=ON but ${strata_cudnn_why}. Configure with -DSTRATA_CUDNN=AUTO or OFF "
                      "to build without it (attention then runs on kernels/cuda's own kernel).")
else()
  message(STATUS "Strata cuDNN fused attention: OFF, ${strata_cudnn_why}; attention uses kernels/cuda's "
                 "own kernel")
endif()
