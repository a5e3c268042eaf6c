# Ask the installed torch (the one the extension must match) where its CMake config lives and what it is.
# Sets FA2_TORCH_PREFIX, FA2_TORCH_VERSION and FA2_TORCH_CUDA (empty for a CPU-only torch).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _fa2_torch_out
  RESULT_VARIABLE _fa2_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fa2_torch_rc EQUAL 0)
  message(FATAL_ERROR "fa2 builds against the installed torch, but '${Python_EXECUTABLE} -c \"import torch\"' failed. "
                      "Install torch first, then build with: pip install --no-build-isolation .")
endif()
string(REPLACE "\n" ";" _fa2_torch_lines "${_fa2_torch_out}")
list(GET _fa2_torch_lines 0 FA2_TORCH_PREFIX)
list(GET _fa2_torch_lines 1 FA2_TORCH_VERSION)
list(LENGTH _fa2_torch_lines _n)
if(_n GREATER 2)
  list(GET _fa2_torch_lines 2 FA2_TORCH_CUDA)
else()
  set(FA2_TORCH_CUDA "")
endif()
message(STATUS "fa2: building against torch ${FA2_TORCH_VERSION} (CUDA '${FA2_TORCH_CUDA}') at ${FA2_TORCH_PREFIX}")
