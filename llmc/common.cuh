// Shared CUDA helpers: the one error-check macro family, the precision switch, small utilities.
// Every kernel file in llmc/ and dev/ includes this and nothing else for these jobs.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <utility>
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

// ---- programmatic dependent launch (PDL; compute capability 9.0 on; CUDA guide, "Programmatic Dependent Launch
// and Synchronization") ----
// A stream starts kernel k+1 only after kernel k has finished and its writes are flushed: for that handover the
// SMs sit idle, a few microseconds on each of a training step's ~400 kernels. A kernel started with
// launch_dependent() may be launched while the kernel before it is still finishing, and its first line is
// pdl_begin():
// - griddepcontrol.launch_dependents: the kernel after this one may be launched once every block of this one has
//   passed here (or exited), so its blocks become resident as this kernel's last blocks leave;
// - griddepcontrol.wait: each thread waits until the kernel before has completed and its memory is visible.
// Nothing of global memory may be touched before pdl_begin(). Chains stay ordered: kernel k+1 waits for k, which
// waited for k-1. Both instructions are no-ops when the kernel was launched the ordinary way, and pdl_begin()
// compiles to nothing below sm_90.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// On by default; `--pdl off` (the trainers) launches every kernel the ordinary way.
inline bool& pdl_enabled() {
    static bool on = true;
    return on;
}
// Where the card has it (compute capability 9.0 on) and the kernels were compiled for it: a binary built for an
// older card and run on a newer one has no griddepcontrol.wait in its kernels, so they must not start early.
static __global__ void pdl_probe_kernel() {}
static inline bool pdl_supported() {  // static: each file asks about its own copy of the probe
    static const bool yes = [] {
        int dev = 0, major = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaFuncAttributes attr{};
        cudaCheck(cudaFuncGetAttributes(&attr, pdl_probe_kernel));
        return major >= 9 && attr.ptxVersion >= 90;
    }();
    return yes;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start early as above (its first line is pdl_begin()).
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = attr, cfg.numAttrs = pdl_enabled() && pdl_supported() ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
