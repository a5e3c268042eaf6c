# Script mode entry to the kernel list, for tools that compile without configuring the project
# (scripts/cuda_compile_check.sh):
#   cmake -DFA2_GEN_DIR=<dir> [-DFA2_HEADDIMS="128"] [-DFA2_CUDA_ARCHS="80;90a"] [-DFA2_DTYPES=fp16]
#         [-DFA2_DISABLE_BWD=ON] -P cmake/generate_kernels.cmake
# writes the instance files and fa2_kernel_instances.h into FA2_GEN_DIR, and <dir>/instances.txt
# (one "<source> <arch>" line per instance) and <dir>/host_sources.txt (the hand-written sources of the enabled
# directions, one a line).
cmake_minimum_required(VERSION 3.18)
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
include(Kernels)
if(NOT FA2_GEN_DIR)
  message(FATAL_ERROR "set -DFA2_GEN_DIR=<dir>")
endif()
if(NOT DEFINED FA2_HEADDIMS)
  set(FA2_HEADDIMS ${FA2_KERNEL_HEADDIMS_SUPPORTED})
endif()
if(NOT DEFINED FA2_CUDA_ARCHS)
  set(FA2_CUDA_ARCHS 80 90)
endif()
if(NOT DEFINED FA2_DTYPES)
  set(FA2_DTYPES ${FA2_KERNEL_DTYPES})
endif()
fa2_enabled_directions(dirs)
get_filename_component(src_dir "${CMAKE_CURRENT_LIST_DIR}/../cuda/src" ABSOLUTE)
fa2_generate_kernels("${src_dir}" "${FA2_GEN_DIR}" DIRECTIONS ${dirs} DTYPES ${FA2_DTYPES}
                     HEADDIMS ${FA2_HEADDIMS} ARCHS ${FA2_CUDA_ARCHS})
set(lines "")
foreach(src arch IN ZIP_LISTS FA2_GEN_SOURCES FA2_GEN_ARCHS)
  string(APPEND lines "${src} ${arch}\n")
endforeach()
file(WRITE "${FA2_GEN_DIR}/instances.txt" "${lines}")
fa2_host_sources("${src_dir}" "${dirs}" host_sources)
list(JOIN host_sources "\n" host_lines)
file(WRITE "${FA2_GEN_DIR}/host_sources.txt" "${host_lines}\n")
