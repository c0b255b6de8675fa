// Shared CUDA helpers: the one error-check macro family, the precision switch, small utilities.
// Every kernel file in llmc/ and dev/ includes this and nothing else for these jobs.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>

// ---- error checks: a failing CUDA/cuBLAS call prints file:line and the reason, then exits 1 ----
inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s at %s:%d\n", cudaGetErrorString(err), file, line);
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS status %d at %s:%d\n", (int)status, file, line);
        exit(EXIT_FAILURE);
    }
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// After a kernel launch: catches bad launch configurations at once (cheap: no synchronization).
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

// ---- precision: PRECISION=BF16 (default) or PRECISION=FP32 picks floatX at build time ----
#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "FP32"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "BF16"
#endif

// ---- more than 48 KB of dynamic shared memory: opt in before EVERY launch that asks for it ----
// Not "once per process" behind a static flag: nvcc 13 gives each .cu file its own copy of a template kernel
// (-static-global-template-stub, on by default), so a flag set by one file's launch skips the opt-in of the
// next file's copy, and that launch fails with "invalid argument" (as it did in the GPU test binary).
// Setting the attribute is a host-side call; it does not synchronize.
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes) {
    if (bytes > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <class T>
__host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

// The current device's SM count, asked once per process (persistent grids and grid-length rules size by it).
inline int sm_count() {
    static const int n = [] {
        int dev = 0, sms = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        return sms;
    }();
    return n;
}
