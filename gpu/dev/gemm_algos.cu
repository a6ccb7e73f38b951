// Issue 20: the drafter step's GEMMs run at the GPU's power cap (an H100 at 700 W held its SM
// clock at 1.2-1.55 GHz under them, gpu/dev/power_interleave_probe.py), so the fastest
// kernel at full clock need not be the fastest one there.  This times every algorithm
// cuBLASLt's heuristic offers for the step's GEMM shapes, each sustained (a run of
// back-to-back GEMMs, the rounds interleaved across algorithms), and prints each one's
// configuration, so that a kernel cheaper in energy shows as faster.
//
//   nvcc -std=c++17 -O2 -arch=sm_90a gpu/dev/gemm_algos.cu -lcublasLt -o /tmp/gemm_algos
//   /tmp/gemm_algos [algos=12] [gemms_a_run=30] [rounds=3]
//
// Layouts as PyTorch's row-major linear maps them onto column-major cuBLAS: TN (forward,
// y = x·Wᵀ), NN (input gradient, dx = g·W), NT (weight gradient, dW = gᵀ·x).  bf16 in and
// out, fp32 accumulation, 64 MiB of workspace; operands uniform in [-1, 1).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    auto e_ = (x);                                                                   \
    if (e_ != 0) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16(float(h) / 2147483648.0f - 1.0f);
  }
}

struct shape { const char* name; bool ta, tb; int m, n, k; };

int main(int argc, char** argv) {
  const int want = argc > 1 ? std::atoi(argv[1]) : 12;
  const int per_run = argc > 2 ? std::atoi(argv[2]) : 30;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const shape shapes[] = {
    {"fwd gate/up   TN", true, false, 12288, 8192, 4096},
    {"fwd down      TN", true, false, 4096, 8192, 12288},
    {"fwd q/o       TN", true, false, 4096, 8192, 4096},
    {"lm-head fwd   TN", true, false, 151936, 2048, 4096},
    {"lm-head dx    NN", false, false, 4096, 2048, 151936},
    {"dx of down    NN", false, false, 12288, 8192, 4096},
    {"dW gate/up    NT", false, true, 4096, 12288, 8192},
    {"dW down       NT", false, true, 12288, 4096, 8192},
  };
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const auto& s : shapes) {
    const size_t na = size_t(s.m) * s.k, nb = size_t(s.k) * s.n, nc = size_t(s.m) * s.n;
    __nv_bfloat16 *a, *b, *c;
    CK(cudaMalloc(&a, na * 2));
    CK(cudaMalloc(&b, nb * 2));
    CK(cudaMalloc(&c, nc * 2));
    fill<<<1024, 256>>>(a, na, 1);
    fill<<<1024, 256>>>(b, nb, 2);
    cublasLtMatmulDesc_t op;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Column-major storage: op(A) is m × k, op(B) k × n.
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.ta ? s.k : s.m));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.tb ? s.n : s.k));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes));
    std::vector<cublasLtMatmulHeuristicResult_t> h(want);
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, want, h.data(), &got));
    const float alpha = 1, beta = 0;
    auto run = [&](int i, int n) {
      for (int r = 0; r < n; ++r)
        CK(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &h[i].algo, ws, ws_bytes, 0));
    };
    std::vector<std::vector<float>> ms(got);
    for (int i = 0; i < got; ++i)
      run(i, 3);
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < got; ++i) {
        run(i, 3);  // back at load before the timed run
        CK(cudaEventRecord(e0));
        run(i, per_run);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms[i].push_back(t / per_run);
      }
    const double flop = 2.0 * s.m * s.n * s.k;
    std::printf("== %s m %d n %d k %d: %d algorithms (0 = the heuristic's first)\n", s.name, s.m, s.n, s.k, got);
    for (int i = 0; i < got; ++i) {
      auto v = ms[i];
      std::sort(v.begin(), v.end());
      const float med = v[v.size() / 2];
      int id = 0, tile = 0, stages = 0, splitk = 0, swz = 0, cluster = 0;
      size_t w;
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                           sizeof cluster, &w);
      std::printf("  %2d  %8.3f ms  %6.1f TFLOP/s  (runs:", i, med, flop / med / 1e9);
      for (float t : ms[i])
        std::printf(" %.3f", t);
      std::printf(")  algo %d tile %d stages %d splitk %d swizzle %d cluster %d ws %zu\n", id, tile, stages, splitk,
                  swz, cluster, h[i].workspaceSize);
    }
    std::fflush(stdout);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  return 0;
}
