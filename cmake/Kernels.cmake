# The one list of CUDA kernel instances: direction x dtype x headdim x arch. It drives the generated instance
# files (one translation unit each, compiled for its own arch only), the library's sources, FA2_KERNELS, and the
# generated dispatch header (fa2_kernel_instances.h: one X-macro per direction), so the launcher's choice of
# instance cannot drift from what was compiled.
#
# A direction <dir> brings
#   cuda/src/<dir>_instance.cu.in   one instance; sees @FA2_INSTANCE@ (its function name), @FA2_CTYPE@,
#                                   @FA2_HEADDIM@, @FA2_ARCH_NUM@ (80, 90), @FA2_ARCH_TAG@ (the kernels' template
#                                   tag: 10 x arch + 1 for an arch-specific build, 800, 900, 901 for 90a),
#                                   @FA2_VARLEN_KERNELS@ (1: it has the varlen kernels, the sm80 path's: every
#                                   instance but an arch-specific one whose plain arch is built too); defines
#                                   the instance function that fa2_kernel_instances.h declares for its direction
#   cuda/src/<dir>_*.cpp|.cu        its hand-written host side (dispatch over FA2_<DIR>_INSTANCES)
# and is enabled by naming it here. FA2_DISABLE_BWD drops "bwd" (and its files) from the build.
# Headdims come from FA2_HEADDIMS, archs from FA2_CUDA_ARCHS (cache options in the root CMakeLists.txt).
include_guard(GLOBAL)

set(FA2_KERNEL_DIRECTIONS fwd bwd decode)
# Directions with arch-specific kernels (sm_90a: wgmma, TMA). For the others an "a" arch is no new code: skipped
# when its plain number is also built (90a next to 90), else compiled as that plain arch's kernels.
set(FA2_KERNEL_DIRECTIONS_ARCH_SPECIFIC fwd bwd)
set(FA2_KERNEL_DTYPES fp16 bf16)
set(FA2_KERNEL_HEADDIMS_SUPPORTED 32 64 96 128 192 256)

set(_fa2_ctype_fp16 "__half")
set(_fa2_ctype_bf16 "__nv_bfloat16")
set(_fa2_dtype_enum_fp16 "::fa2::DType::kFloat16")
set(_fa2_dtype_enum_bf16 "::fa2::DType::kBFloat16")

# The enabled directions: FA2_KERNEL_DIRECTIONS less "bwd" when FA2_DISABLE_BWD.
function(fa2_enabled_directions out_var)
  set(dirs ${FA2_KERNEL_DIRECTIONS})
  if(FA2_DISABLE_BWD)
    list(REMOVE_ITEM dirs bwd)
  endif()
  set(${out_var} ${dirs} PARENT_SCOPE)
endfunction()

# The hand-written host sources of the enabled directions: <src_dir>/<dir>_*.{cpp,cu} belong to direction <dir>
# (kept only when it is enabled); the other *.cpp / *.cu are shared by all directions.
function(fa2_host_sources src_dir enabled_dirs out_var)
  file(GLOB all_src "${src_dir}/*.cpp" "${src_dir}/*.cu")
  set(sources "")
  foreach(src IN LISTS all_src)
    get_filename_component(name "${src}" NAME)
    set(keep ON)
    foreach(dir IN LISTS FA2_KERNEL_DIRECTIONS ITEMS bwd)
      if(name MATCHES "^${dir}_" AND NOT dir IN_LIST enabled_dirs)
        set(keep OFF)
      endif()
    endforeach()
    if(keep)
      list(APPEND sources "${src}")
    endif()
  endforeach()
  set(${out_var} ${sources} PARENT_SCOPE)
endfunction()

# fa2_generate_kernels(<src_dir> <gen_dir> DIRECTIONS ... DTYPES ... HEADDIMS ... ARCHS ...)
# Writes <gen_dir>/<instance>.cu for every combination and <gen_dir>/fa2_kernel_instances.h. Sets in the caller:
#   FA2_GEN_INSTANCES  instance names, e.g. fwd_bf16_hdim128_sm90
#   FA2_GEN_SOURCES    the generated .cu files (same order)
#   FA2_GEN_ARCHS      the arch of each file (same order), as written in FA2_CUDA_ARCHS (80, 86, 90, 90a ...)
# Works at configure time and in script mode (cmake -P cmake/generate_kernels.cmake).
function(fa2_generate_kernels src_dir gen_dir)
  cmake_parse_arguments(ARG "" "" "DIRECTIONS;DTYPES;HEADDIMS;ARCHS" ${ARGN})
  foreach(hd IN LISTS ARG_HEADDIMS)
    if(NOT hd IN_LIST FA2_KERNEL_HEADDIMS_SUPPORTED)
      message(FATAL_ERROR "fa2: FA2_HEADDIMS has ${hd}; instantiable headdims are ${FA2_KERNEL_HEADDIMS_SUPPORTED}")
    endif()
  endforeach()
  foreach(arch IN LISTS ARG_ARCHS)
    if(NOT arch MATCHES "^([0-9]+)a?$" OR CMAKE_MATCH_1 LESS 80)
      message(FATAL_ERROR "fa2: FA2_CUDA_ARCHS has '${arch}'; the sm80 kernels need compute capability >= 80 "
                          "(e.g. 80;86;89;90)")
    endif()
  endforeach()
  file(MAKE_DIRECTORY "${gen_dir}")
  set(instances "")
  set(sources "")
  set(archs "")
  set(macros "")
  set(FA2_DECLS "")
  foreach(dir IN LISTS ARG_DIRECTIONS)
    string(TOUPPER "${dir}" DIR)
    set(template "${src_dir}/${dir}_instance.cu.in")
    if(NOT EXISTS "${template}")
      message(FATAL_ERROR "fa2: kernel direction '${dir}' has no ${template}")
    endif()
    set(macro "// X(instance, dtype, headdim, arch, arch_specific): every ${dir} instance of this build\n#define FA2_${DIR}_INSTANCES(X)")
    foreach(dtype IN LISTS ARG_DTYPES)
      foreach(hd IN LISTS ARG_HEADDIMS)
        foreach(arch IN LISTS ARG_ARCHS)
          string(REGEX REPLACE "[^0-9]" "" arch_num "${arch}")
          # 90a: SASS for compute capability 9.0 exactly, with the arch-specific instructions (wgmma, setmaxnreg)
          set(arch_specific 0)
          # (varlen runs the sm80 path's kernels: an sm_90a instance carries them only where no sm_90 one does)
          set(FA2_VARLEN_KERNELS 1)
          if(arch MATCHES "a$" AND arch_num IN_LIST ARG_ARCHS)
            set(FA2_VARLEN_KERNELS 0)
          endif()
          if(arch MATCHES "a$")
            if(NOT dir IN_LIST FA2_KERNEL_DIRECTIONS_ARCH_SPECIFIC)
              if(arch_num IN_LIST ARG_ARCHS)
                continue()
              endif()
            else()
              set(arch_specific 1)
            endif()
          endif()
          set(FA2_INSTANCE "${dir}_${dtype}_hdim${hd}_sm${arch}")
          set(FA2_CTYPE "${_fa2_ctype_${dtype}}")
          set(FA2_HEADDIM "${hd}")
          set(FA2_ARCH_NUM "${arch_num}")
          math(EXPR FA2_ARCH_TAG "${arch_num} * 10 + ${arch_specific}")  # kernels' template tag: 800, 900, 901
          configure_file("${template}" "${gen_dir}/${FA2_INSTANCE}.cu" @ONLY)
          list(APPEND instances "${FA2_INSTANCE}")
          list(APPEND sources "${gen_dir}/${FA2_INSTANCE}.cu")
          list(APPEND archs "${arch}")
          string(APPEND macro " \\\n  X(${FA2_INSTANCE}, ${_fa2_dtype_enum_${dtype}}, ${hd}, ${arch_num}, ${arch_specific})")
        endforeach()
      endforeach()
    endforeach()
    string(APPEND macros "${macro}\n#define FA2_HAS_${DIR}_KERNELS 1\n\n")
    string(APPEND FA2_DECLS "FA2_${DIR}_INSTANCES(FA2_DECLARE_${DIR}_INSTANCE)\n")
  endforeach()
  file(CONFIGURE OUTPUT "${gen_dir}/fa2_kernel_instances.h" CONTENT
"// Generated by cmake/Kernels.cmake: the kernel instances of this build. Do not edit.
#pragma once
#include <cuda_runtime_api.h>

#include \"fa2/decode/plan.h\"
#include \"fa2/params.h\"
#include \"fa2/plan.h\"

${macros}namespace fa2 {
#define FA2_DECLARE_FWD_INSTANCE(name, dtype, headdim, arch, arch_specific) \\
  const char* name(const FwdPlan&, const AttentionParams&, cudaStream_t);
#define FA2_DECLARE_BWD_INSTANCE(name, dtype, headdim, arch, arch_specific) \\
  const char* name(const BwdPlan&, const AttentionParams&, cudaStream_t, bool*);
#define FA2_DECLARE_DECODE_INSTANCE(name, dtype, headdim, arch, arch_specific) \\
  const char* name(const DecodePlan&, const DecodeParams&, cudaStream_t);
@FA2_DECLS@
#undef FA2_DECLARE_FWD_INSTANCE
#undef FA2_DECLARE_BWD_INSTANCE
#undef FA2_DECLARE_DECODE_INSTANCE
}  // namespace fa2
" @ONLY)
  set(FA2_GEN_INSTANCES ${instances} PARENT_SCOPE)
  set(FA2_GEN_SOURCES ${sources} PARENT_SCOPE)
  set(FA2_GEN_ARCHS ${archs} PARENT_SCOPE)
endfunction()
