// Self-test of the Hopper layer alone (llmc/ptx/hopper.cuh + the qk_gemm / pv_gemm / to_p of
// llmc/attention/wgmma_forward.cuh, which rungs 7 and 8 and the trainer run), so that a failure of the full kernel
// can be pinned to the data path or to the pipeline around it. One warpgroup:
//   TMA loads Q (64×HS), K and V (128×HS, of which only T_kv = 100 rows exist: rows 100..127 must arrive as
//   zeros) in the 128-byte swizzled layout → S = Q Kᵀ by wgmma (both operands K-major descriptors) → P =
//   bf16(S) in registers → O = P V by wgmma (A from registers, V through an MN-major descriptor).
// Host checks, in double: S against Q Kᵀ; O against bf16(S_gpu) · V (the kernel's own S, so the P·V path is
// judged alone). Tolerance 1e-4 of max|ref|: both products accumulate exact bf16 products in fp32 over ≤ 128
// terms (relative rounding ~1e-6); a wrong descriptor, swizzle or fragment layout is off by O(1).
// Build and run (sm_90a):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. dev/attention/forward/hopper_ptx_selftest.cu \
//        -o build/hopper_ptx_selftest && ./build/hopper_ptx_selftest
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "llmc/error.h"
#include "dev/attention/forward/7_hopper_wgmma.cuh"

namespace selftest {

using namespace ladder::r7;
constexpr int kRowsQ = 64, kRowsKV = 128, kTkv = 100;

template <int HS>
using C1 = Cfg<HS, 1, 128, 1>;  // one consumer warpgroup (Br = 64), Bc = 128, one stage

template <int HS>
__global__ void __launch_bounds__(128) datapath_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                       const __grid_constant__ CUtensorMap tm_k,
                                                       const __grid_constant__ CUtensorMap tm_v, float* s_out,
                                                       float* o_out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = C1<HS>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = hp::smem_u32(smem_raw);
    const Smem<C> sm{(raw + 1023) & ~1023u};
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        hp::mbar_init(sm.q_full(0), 1);
        hp::fence_barrier_init();
    }
    __syncthreads();  // the barrier is initialized before anyone uses it
    if (threadIdx.x == 0) {
        hp::mbar_arrive_expect_tx(sm.q_full(0), C::Q_BYTES + 2 * C::KV_BYTES);
        for (int p = 0; p < C::PANELS; p++) {
            hp::tma_load_3d(sm.q(0) + p * C::BR * 128, &tm_q, sm.q_full(0), 64 * p, 0, 0);
            hp::tma_load_3d(sm.k(0) + p * C::BC * 128, &tm_k, sm.q_full(0), 64 * p, 0, 0);
            hp::tma_load_3d(sm.v(0) + p * C::BC * 128, &tm_v, sm.q_full(0), 64 * p, 0, 0);
        }
    }
    hp::mbar_wait(sm.q_full(0), 0);  // Q, K, V have landed

    float s[C::BC / 8][4];
    float o[HS / 8][4] = {};
    uint32_t p[C::BC / 16][4];
    hp::wgmma_fence();
    qk_gemm<C>(s, sm.q(0), sm.k(0));
    hp::wgmma_commit();
    hp::wgmma_wait<0>();
    hp::fence_regs(s);
    to_p(p, s);
    hp::wgmma_fence();
    pv_gemm<C>(o, p, sm.v(0));
    hp::wgmma_commit();
    hp::wgmma_wait<0>();
    hp::fence_regs(o);

    // Accumulator layout: [c][0..1] row 16·warp + g, columns 8c + 2t, +1; [c][2..3] the row 8 below.
    const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);
    for (int c = 0; c < C::BC / 8; c++)
        for (int e = 0; e < 4; e++) s_out[(r0 + 8 * (e >> 1)) * C::BC + 8 * c + c0 + (e & 1)] = s[c][e];
    for (int c = 0; c < HS / 8; c++)
        for (int e = 0; e < 4; e++) o_out[(r0 + 8 * (e >> 1)) * HS + 8 * c + c0 + (e & 1)] = o[c][e];
#endif
}

float bf16_round(float f) { return __bfloat162float(__float2bfloat16(f)); }

template <int HS>
bool run(std::mt19937& rng) {
    using C = C1<HS>;
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<__nv_bfloat16> q(kRowsQ * HS), k(kTkv * HS), v(kTkv * HS);
    for (auto* t : {&q, &k, &v})
        for (auto& x : *t) x = __float2bfloat16(uni(rng) + 0.3f);
    __nv_bfloat16 *dq, *dk, *dv;
    float *ds, *dout;
    cudaCheck(cudaMalloc(&dq, q.size() * 2));
    cudaCheck(cudaMalloc(&dk, k.size() * 2));
    cudaCheck(cudaMalloc(&dv, v.size() * 2));
    cudaCheck(cudaMalloc(&ds, kRowsQ * C::BC * 4));
    cudaCheck(cudaMalloc(&dout, kRowsQ * HS * 4));
    cudaCheck(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(ds, 0xFF, kRowsQ * C::BC * 4));  // NaN: an element not written fails
    cudaCheck(cudaMemset(dout, 0xFF, kRowsQ * HS * 4));
    const CUtensorMap mq = hp::make_head_map(dq, 1, kRowsQ, HS, kRowsQ);
    const CUtensorMap mk = hp::make_head_map(dk, 1, kTkv, HS, kRowsKV);
    const CUtensorMap mv = hp::make_head_map(dv, 1, kTkv, HS, kRowsKV);
    allow_shared_memory(datapath_kernel<HS>, C::SMEM);
    datapath_kernel<HS><<<1, 128, C::SMEM>>>(mq, mk, mv, ds, dout);
    cudaCheckLaunch();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> s(kRowsQ * C::BC), o(kRowsQ * HS);
    cudaCheck(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));

    auto f = [](__nv_bfloat16 x) { return (double)__bfloat162float(x); };
    double s_err = 0, s_max = 0, o_err = 0, o_max = 0;
    int bad_zero = 0;
    for (int r = 0; r < kRowsQ; r++)
        for (int c = 0; c < C::BC; c++) {
            double ref = 0;
            if (c < kTkv)
                for (int d = 0; d < HS; d++) ref += f(q[r * HS + d]) * f(k[c * HS + d]);
            const double got = s[r * C::BC + c];
            s_err = std::isfinite(got) ? std::max(s_err, std::fabs(got - ref)) : INFINITY;
            s_max = std::max(s_max, std::fabs(ref));
            if (c >= kTkv && got != 0.0) bad_zero++;  // K rows past T must have arrived as zeros
        }
    for (int r = 0; r < kRowsQ; r++)
        for (int c = 0; c < HS; c++) {
            double ref = 0;
            for (int kk = 0; kk < kTkv; kk++) ref += (double)bf16_round(s[r * C::BC + kk]) * f(v[kk * HS + c]);
            const double got = o[r * HS + c];
            o_err = std::isfinite(got) ? std::max(o_err, std::fabs(got - ref)) : INFINITY;
            o_max = std::max(o_max, std::fabs(ref));
        }
    const bool s_ok = s_err <= 1e-4 * s_max && bad_zero == 0, o_ok = o_err <= 1e-4 * o_max;
    printf("HS %3d  S = Q K^T (TMA, swizzle, K-major descriptors): max err %.3e of max %.3e, %d nonzero past T  %s\n",
           HS, s_err, s_max, bad_zero, s_ok ? "ok" : "FAIL");
    printf("HS %3d  O = P V   (P in registers, V MN-major descriptor): max err %.3e of max %.3e  %s\n", HS, o_err,
           o_max, o_ok ? "ok" : "FAIL");
    for (void* ptr : {(void*)dq, (void*)dk, (void*)dv, (void*)ds, (void*)dout}) cudaCheck(cudaFree(ptr));
    return s_ok && o_ok;
}

}  // namespace selftest

int main() {
    return flashgpt2::run_main([] {
        if (!ladder::r7::sm90a_available()) {
            printf("hopper selftest: skipped (needs an sm_90a build on an sm_90 GPU)\n");
            return 0;
        }
        std::mt19937 rng(1234);
        const bool ok = selftest::run<64>(rng) & selftest::run<128>(rng);
        printf("hopper selftest: %s\n", ok ? "all ok" : "FAILED");
        return ok ? 0 : 1;
    });
}
