#pragma once
// Precompiled for every LibTorch translation unit in gpu/ and the GPU tests.
// Only gpu/ may include these; actors/ sees gpu/ through torch-free facades.
#include <torch/torch.h>
#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
