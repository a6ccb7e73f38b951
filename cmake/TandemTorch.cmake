# TandemTorch.cmake — find LibTorch inside a Python environment.
#
# LibTorch comes from the PyPI wheel torch==2.11.0 (CUDA 13.0 build).  The
# interpreter that holds it is TANDEM_PYTHON (default: python3 on PATH; the
# setup script passes the per-user virtual environment, and an air-gapped GPU
# host passes its own PyTorch install).
set(TANDEM_TORCH_VERSION_WANTED "2.11" CACHE STRING "LibTorch major.minor this tree is written against")
find_program(TANDEM_PYTHON NAMES python3 python REQUIRED)

execute_process(
  COMMAND "${TANDEM_PYTHON}" -c
    "import os, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))"
  OUTPUT_VARIABLE _tt_out ERROR_VARIABLE _tt_err RESULT_VARIABLE _tt_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tt_rc EQUAL 0)
  message(FATAL_ERROR
    "TANDEM_PYTHON=${TANDEM_PYTHON} cannot import torch:\n${_tt_err}\n"
    "Run tools/setup (it creates the torch environment), or pass "
    "-DTANDEM_PYTHON=/path/to/python3 of an environment with torch==2.11.0.")
endif()
string(REPLACE "\n" ";" _tt_lines "${_tt_out}")
list(GET _tt_lines 0 TANDEM_TORCH_CMAKE_PREFIX)
list(GET _tt_lines 1 TANDEM_TORCH_VERSION)
list(GET _tt_lines 2 TANDEM_TORCH_SITE_PACKAGES)
if(NOT TANDEM_TORCH_VERSION MATCHES "^${TANDEM_TORCH_VERSION_WANTED}\\.")
  message(WARNING "torch ${TANDEM_TORCH_VERSION} found; Tandem is written against ${TANDEM_TORCH_VERSION_WANTED}.x")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${TANDEM_TORCH_CMAKE_PREFIX}")

# Torch's CMake files look for the CUDA toolkit themselves when the wheel is a
# CUDA build and, left alone, add nvcc flags for eleven architectures.  Tandem
# compiles its kernels in its own target for TANDEM_CUDA_ARCHITECTURES, so
# tell Torch the same and keep the configure output quiet.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0a")
endif()
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${TANDEM_TORCH_VERSION} from ${TANDEM_TORCH_SITE_PACKAGES}")

# The NCCL that libtorch_cuda.so loads (nvidia-nccl-cu13 wheel), if present.
set(NCCL_TORCH_HINT "${TANDEM_TORCH_SITE_PACKAGES}/nvidia/nccl")
