// Matmul with bias, llm.c's layout: out (N,OC) = inp (N,C) @ w^T + bias, w (OC,C), bias (OC).
//
// naive: one thread per output element, every operand read from global memory (through the caches):
//        2*C loads per output, no reuse held on chip. The backward: one thread per element of dinp, of
//        dw, and of dbias, each looping over its reduction dimension.
// flash: cuBLASLt on the tensor cores: tiles of inp and w are staged in shared memory and reused by many
//        outputs, so each element is read from HBM a handful of times instead of OC or N times. The bias
//        add (and GELU, see gelu.cuh) happens in the epilogue, on the accumulator, before the one write.
//        dbias is a deterministic two-stage column sum (per-split partials, then a fixed-order sum).
//        Two engines: cuBLASLt for every call, and on Hopper in BF16 builds our own wgmma kernel for the two
//        calls that carry GELU (the MLP's fc forward and fcproj's dinp; llmc/matmul/wgmma_gelu.cuh), where
//        cuBLASLt's fused epilogues cost more than the GEMM's own time (doc/kernels.md).
//
// Row-major (N,C) is column-major (C,N): cuBLAS sees out^T (OC,N) = w^T... written below per call.
// FP32 build: CUBLAS_COMPUTE_32F, true fp32 (no TF32), the exactness reference.
#pragma once
#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <functional>

#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/kernel_common.cuh"
#include "llmc/matmul_algos.h"
#if !defined(ENABLE_FP32)
#include "llmc/matmul/wgmma_gelu.cuh"
#endif

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// cuBLAS / cuBLASLt handles and workspace: created once, on first use, shared by every op.

constexpr size_t BLAS_WORKSPACE_BYTES = 32u << 20;

struct Blas {
    cublasHandle_t handle = nullptr;   // cuBLAS (the naive attention's batched GEMMs)
    cublasLtHandle_t lt = nullptr;     // cuBLASLt (the flash matmuls)
    void* workspace = nullptr;         // BLAS_WORKSPACE_BYTES for cuBLASLt
};

inline Blas& blas() {
    static Blas b = [] {
        Blas x;
        cublasCheck(cublasCreate(&x.handle));
        cublasCheck(cublasSetMathMode(x.handle, CUBLAS_DEFAULT_MATH));  // no TF32: fp32 stays fp32
        cublasCheck(cublasLtCreate(&x.lt));
        cudaCheck(cudaMalloc(&x.workspace, BLAS_WORKSPACE_BYTES));
        return x;
    }();
    return b;
}

// Device memory the handles hold besides cuBLAS's own internal buffers (for the trainer's memory table).
inline size_t blas_workspace_bytes() { return BLAS_WORKSPACE_BYTES; }

#if defined(ENABLE_FP32)
constexpr cudaDataType_t CUDA_FLOATX = CUDA_R_32F;
#else
constexpr cudaDataType_t CUDA_FLOATX = CUDA_R_16BF;
#endif

// Largest power of two (<= 256) dividing the address: tells the cuBLASLt heuristic what it may assume.
inline uint32_t ptr_alignment(const void* p) {
    uint32_t a = 256;
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a) a >>= 1;
    return a;
}

// ---------------------------------------------------------------------------------------------------------
// The flash matmul's engine for the calls that carry GELU (`--matmul flash[:engine]`; every other call is
// cuBLASLt's): best = wgmma wherever it runs.
enum class MatmulEngine { best, cublaslt, wgmma };
constexpr MatmulEngine MATMUL_ENGINES[] = {MatmulEngine::cublaslt, MatmulEngine::wgmma};
inline const char* engine_name(MatmulEngine e) {
    return e == MatmulEngine::cublaslt ? "cublaslt" : e == MatmulEngine::wgmma ? "wgmma" : "best";
}
inline MatmulEngine parse_matmul_engine(const std::string& s, const std::string& what) {
    for (MatmulEngine e : MATMUL_ENGINES)
        if (s == engine_name(e)) return e;
    fail("%s: unknown matmul engine '%s' (expected cublaslt or wgmma)", what.c_str(), s.c_str());
}
// Why engine e cannot run a GELU matmul of N output columns, K deep, here; nullptr when it can.
inline const char* matmul_engine_unsupported(MatmulEngine e, int N, int K) {
    if (e != MatmulEngine::wgmma) return nullptr;
#if defined(ENABLE_FP32)
    (void)N, (void)K;
    return "it is bf16: it needs the BF16 build (PRECISION=BF16)";
#else
    if (!hopper::sm90a_available()) return "it needs an sm_90a build on an H100/H200";
    if (N % 8 != 0 || K % 8 != 0) return "its TMA copies need both dimensions a multiple of 8";
    return nullptr;
#endif
}
// The engine that runs a GELU matmul: the request, or an Error naming why it cannot; best = wgmma when it can.
inline MatmulEngine gelu_matmul_engine(MatmulEngine request, int N, int K) {
    if (request == MatmulEngine::best)
        return matmul_engine_unsupported(MatmulEngine::wgmma, N, K) ? MatmulEngine::cublaslt : MatmulEngine::wgmma;
    if (const char* why = matmul_engine_unsupported(request, N, K))
        fail("--matmul flash:%s cannot run the GELU matmul (N %d, K %d): %s (--matmul flash:cublaslt can)",
             engine_name(request), N, K, why);
    return request;
}

// ---------------------------------------------------------------------------------------------------------
// Which algorithm each distinct call takes (`--matmul-algos`; the table's format: llmc/matmul_algos.h).
// A call met for the first time takes cuBLASLt's heuristic's first algorithm, except while `timing` is on (the
// trainer's tuning pass: one forward and backward whose results are thrown away): then it runs each of the
// heuristic's first MATMUL_TUNE_CANDIDATES on its own operands, MATMUL_TUNE_RUNS times after a warm-up, and
// keeps the one with the lowest median. Either way the choice is kept in the table, and a call found in the
// table (also one loaded from a file) takes the table's algorithm. Timing runs only in that pass because a call
// with beta != 0 adds into D, and the pass's D are overwritten afterwards.
constexpr int MATMUL_TUNE_CANDIDATES = 8, MATMUL_TUNE_RUNS = 5;

struct MatmulAlgos {
    bool timing = false;
    MatmulAlgoTable table;
    int force_pick = -1;          // the GPU test: while timing, take this candidate (if it runs) instead of the fastest
};
inline MatmulAlgos& matmul_algos() {
    static MatmulAlgos m;
    return m;
}

// The card and library a table is valid for: "<name> | <SMs> SMs | cuBLASLt <version>".
inline std::string matmul_algos_device() {
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, dev));
    return std::string(p.name) + " | " + std::to_string(p.multiProcessorCount) + " SMs | cuBLASLt " +
           std::to_string(cublasLtGetVersion());
}

// Replaces the table by the one in `path`, which must have been made on this card with this cuBLASLt.
inline void load_matmul_algos(const std::string& path) {
    MatmulAlgoTable t = parse_matmul_algos(read_file(path), path);
    const std::string here = matmul_algos_device();
    if (t.device != here)
        fail("%s: made on '%s', this is '%s': its algorithms may not run or be the fastest here (start a run with "
             "--matmul-algos tune to make a table for this card)", path.c_str(), t.device.c_str(), here.c_str());
    matmul_algos().table = std::move(t);  // its entries are checked at their first call
}

inline void save_matmul_algos(const std::string& path) {
    MatmulAlgoTable& t = matmul_algos().table;
    t.device = matmul_algos_device();
    write_file_atomic(path, format_matmul_algos(t));
}

// The trainer's --matmul-algos MODE for the run in `dir`: "heuristic" (every call takes the heuristic's first);
// a table file; or "tune": `pass` (one forward and backward whose activations and gradients step 1 overwrites)
// runs with every new call timed, and the choices go to dir/matmul_algos.txt, which a resume reads back.
// Returns the run header's line.
inline std::string setup_matmul_algos(const std::string& mode, const std::string& dir, bool resume, int world,
                                      const std::function<void()>& pass) {
    MatmulAlgos& ma = matmul_algos();
    ma = MatmulAlgos{};  // nothing an earlier run in this process (the tests) chose stays behind
    const std::string mine = (std::filesystem::path(dir) / "matmul_algos.txt").string();
    if (mode == "heuristic") return "matmul algorithms: cuBLASLt's heuristic's first";
    if (mode != "tune" || resume) {
        const std::string& file = mode != "tune" ? mode : mine;
        if (!std::filesystem::exists(file))
            fail("--matmul-algos: %s does not exist%s", file.c_str(),
                 mode != "tune" ? "" : " (this run tuned its matmuls, and a resume takes the algorithms it chose)");
        load_matmul_algos(file);
        return "matmul algorithms: " + std::to_string(ma.table.calls.size()) + " calls from " + file;
    }
    if (world > 1)
        fail("--matmul-algos tune: with --num-gpus %d each GPU would time its own; tune on one GPU and pass its "
             "DIR/matmul_algos.txt", world);
    ma.timing = true;
    pass();
    ma.timing = false;
    save_matmul_algos(mine);
    int other = 0;
    for (const auto& call : ma.table.calls) other += call.second.pick != 0;
    return "matmul algorithms: tuned, " + std::to_string(other) + " of " + std::to_string(ma.table.calls.size()) +
           " calls faster off the heuristic's first; saved to " + mine;
}

// Column-major D (m,n) = op(A) (m,k) @ op(B) (k,n) + beta * D, then the epilogue (bias of length m, GELU with
// aux (m,n) ld ldaux, or DGELU reading aux). All matrices floatX, accumulation fp32.
inline void cublaslt_matmul(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a,
                            bool trans_b, int lda, int ldb, int ldd, float beta, cublasLtEpilogue_t epilogue,
                            const floatX* bias, const floatX* aux, int ldaux, cudaStream_t stream) {
    Blas& bl = blas();
    cublasLtMatmulDesc_t op;
    cublasCheck(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (aux) {
        int64_t ld = ldaux;
        cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld_;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_FLOATX, trans_a ? k : m, trans_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_FLOATX, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld_, CUDA_FLOATX, m, n, ldd));

    // The heuristic is asked once per distinct call (shape, transposes, epilogue, alignments) and the answer kept
    // in the table: the query costs host time on every launch, and a training step makes ~150 of these calls.
    const uint32_t al_a = ptr_alignment(a), al_b = ptr_alignment(b), al_d = ptr_alignment(d);
    const MatmulKey key = {m, n, k, trans_a, trans_b, lda, ldb, ldd, (int64_t)epilogue, aux ? ldaux : -1,
                           (int64_t)al_a << 32 | al_b, al_d};  // (the epilogue says if there is a bias)
    const float alpha = 1.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(bl.lt, op, &alpha, a, la, b, lb, &beta, d, ld_, d, ld_, &algo, bl.workspace,
                              BLAS_WORKSPACE_BYTES, stream);
    };
    static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(MatmulChoice::algo), "the table keeps the algorithm's bytes");
    MatmulAlgos& ma = matmul_algos();
    auto it = ma.table.calls.find(key);
    if (it == ma.table.calls.end()) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = BLAS_WORKSPACE_BYTES;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
        cublasLtMatmulHeuristicResult_t heur[MATMUL_TUNE_CANDIDATES];
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(bl.lt, op, la, lb, ld_, ld_, pref, ma.timing ? MATMUL_TUNE_CANDIDATES : 1,
                                                   heur, &found));
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        if (found == 0)
            fail("matmul_flash: cuBLASLt has no algorithm for m=%d n=%d k=%d (epilogue %d)", m, n, k, (int)epilogue);
        MatmulChoice c;
        c.candidates = found;
        if (ma.timing) {  // each candidate: a warm-up, then MATMUL_TUNE_RUNS timed runs; the lowest median wins
            cudaEvent_t ev[MATMUL_TUNE_RUNS + 1];
            for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
            float median[MATMUL_TUNE_CANDIDATES];
            for (int i = 0; i < found; i++) {
                median[i] = INFINITY;
                if (run(heur[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // offered but refused: not a candidate
                cudaCheck(cudaEventRecord(ev[0], stream));
                for (int r = 0; r < MATMUL_TUNE_RUNS; r++) {
                    cublasCheck(run(heur[i].algo));
                    cudaCheck(cudaEventRecord(ev[r + 1], stream));
                }
                cudaCheck(cudaEventSynchronize(ev[MATMUL_TUNE_RUNS]));
                float t[MATMUL_TUNE_RUNS];
                for (int r = 0; r < MATMUL_TUNE_RUNS; r++) cudaCheck(cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]));
                std::sort(t, t + MATMUL_TUNE_RUNS);
                median[i] = t[MATMUL_TUNE_RUNS / 2];
                if (median[i] < median[c.pick]) c.pick = i;
            }
            for (cudaEvent_t& e : ev) cudaCheck(cudaEventDestroy(e));
            if (ma.force_pick >= 0 && ma.force_pick < found && median[ma.force_pick] < INFINITY) c.pick = ma.force_pick;
            if (median[c.pick] == INFINITY) fail("matmul_flash: no candidate algorithm ran for m=%d n=%d k=%d", m, n, k);
            c.us = median[c.pick] * 1000.0f;  // the time of the one kept
        }
        memcpy(c.algo.data(), &heur[c.pick].algo, sizeof(cublasLtMatmulAlgo_t));
        c.checked = true;  // the heuristic offered it for this very call
        it = ma.table.calls.emplace(key, c).first;
    }
    cublasLtMatmulAlgo_t algo;
    memcpy(&algo, it->second.algo.data(), sizeof algo);
    if (!it->second.checked) {  // from a loaded table: it must run this call as it is described here
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(bl.lt, op, la, lb, ld_, ld_, &algo, &check) != CUBLAS_STATUS_SUCCESS)
            fail("matmul algorithm table: its algorithm for m=%d n=%d k=%d (epilogue %d) does not run this call",
                 m, n, k, (int)epilogue);
        it->second.checked = true;
    }
    cublasCheck(run(algo));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld_));
    cublasCheck(cublasLtMatmulDescDestroy(op));
}

// ---------------------------------------------------------------------------------------------------------
// forward

static __global__ void matmul_forward_naive_kernel(floatX* out, const floatX* inp, const floatX* w, const floatX* bias,
                                            int N, int C, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one output (n, oc)
    if (idx >= (size_t)N * OC) return;
    int n = (int)(idx / OC), oc = (int)(idx % OC);
    const floatX* x = inp + (size_t)n * C;
    const floatX* wr = w + (size_t)oc * C;
    float acc = bias ? to_float(bias[oc]) : 0.0f;
    for (int c = 0; c < C; c++) acc += to_float(x[c]) * to_float(wr[c]);
    out[idx] = from_float<floatX>(acc);
}

inline void matmul_forward_naive(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                                 int OC, cudaStream_t stream) {
    matmul_forward_naive_kernel<<<grid_for((size_t)N * OC, 256), 256, 0, stream>>>(out, inp, w, bias, N, C, OC);
    cudaCheckLaunch();
}

// pre_gelu == nullptr: out = inp @ w^T + bias.
// pre_gelu != nullptr: pre_gelu = inp @ w^T + bias and out = gelu(pre_gelu), both from the one GEMM, on the
// engine gelu_matmul_engine(engine, OC, C) picks.
inline void matmul_forward_flash(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                                 int OC, floatX* pre_gelu, cudaStream_t stream,
                                 MatmulEngine engine = MatmulEngine::best) {
    const bool wgmma = pre_gelu && gelu_matmul_engine(engine, OC, C) == MatmulEngine::wgmma;
#if !defined(ENABLE_FP32)
    if (wgmma) return matmul_forward_gelu_wgmma(out, pre_gelu, inp, w, bias, N, OC, C, stream);
#endif
    // column-major: out^T (OC, N) = (w as (C,OC))^T @ (inp as (C,N))
    cublasLtEpilogue_t ep = pre_gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                     : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    cublaslt_matmul(out, w, inp, OC, N, C, true, false, C, C, OC, 0.0f, ep, bias, pre_gelu, OC, stream);
}

// ---------------------------------------------------------------------------------------------------------
// backward

static __global__ void matmul_backward_dinp_naive_kernel(floatX* dinp, const floatX* dout, const floatX* w, int N, int C,
                                                  int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element (n, c) of dinp
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    float acc = 0.0f;
    for (int oc = 0; oc < OC; oc++) acc += to_float(dout[(size_t)n * OC + oc]) * to_float(w[(size_t)oc * C + c]);
    dinp[idx] = from_float<floatX>(acc);
}

static __global__ void matmul_backward_dw_naive_kernel(floatX* dw, const floatX* dout, const floatX* inp, int N, int C,
                                                int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element (oc, c) of dw
    if (idx >= (size_t)OC * C) return;
    int oc = (int)(idx / C), c = (int)(idx % C);
    float acc = 0.0f;
    for (int n = 0; n < N; n++) acc += to_float(dout[(size_t)n * OC + oc]) * to_float(inp[(size_t)n * C + c]);
    dw[idx] = from_float<floatX>(to_float(dw[idx]) + acc);
}

inline void matmul_backward_naive(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp,
                                  const floatX* w, int N, int C, int OC, cudaStream_t stream) {
    matmul_backward_dinp_naive_kernel<<<grid_for((size_t)N * C, 256), 256, 0, stream>>>(dinp, dout, w, N, C, OC);
    cudaCheckLaunch();
    matmul_backward_dw_naive_kernel<<<grid_for((size_t)OC * C, 256), 256, 0, stream>>>(dw, dout, inp, N, C, OC);
    cudaCheckLaunch();
    if (dbias) colsum_naive(dbias, dout, N, OC, stream);  // one thread per element of dbias (kernel_common.cuh)
}

// dbias, flash: a deterministic two-stage column sum of x (N, OC), in one kernel; x is dout (floatX), or fp32
// partial sums (the GELU matmul's per-tile column sums, below). Stage 1: rows are cut into S splits (S depends
// only on N); a block of DBIAS_WARPS warps takes 32 * V columns of one split (V elements of T per 16 bytes): each
// lane reads V consecutive columns with one 16-byte load (a warp reads 512 contiguous bytes of a row), warps take
// every DBIAS_WARPS-th row, and the block adds its warps' sums in a fixed order into partial (S, OC). Stage 2:
// the last of a column group's S blocks to finish (an arrival counter per group) adds the S partials per column
// in order, so no second kernel and its handover. (The 16-byte loads took about a third off the wide OCs against
// one 2-byte load per thread and row: doc/kernels.md.)
constexpr int DBIAS_ROWS_PER_SPLIT = 64, DBIAS_MAX_SPLITS = 64, DBIAS_WARPS = 8;
template <class T>
constexpr int DBIAS_COLS = 32 * Packed128<T>::size;  // the columns of one block's group
static_assert(DBIAS_COLS<floatX> <= DBIAS_WARPS * 32 && DBIAS_COLS<float> <= DBIAS_WARPS * 32,
              "a block has a thread for each column of its group (stage 2)");
constexpr int DBIAS_MAX_GROUPS = 1024;  // column groups the arrival counters cover: OC <= 1024 * DBIAS_COLS
// Per column group: how many of its S blocks have written their partials. Zero when a kernel starts (zero at
// load, and the last block of each group puts it back), so calls on one stream follow each other safely; two
// streams must not run dbias at once.
static __device__ unsigned int dbias_arrivals[DBIAS_MAX_GROUPS];
inline int dbias_splits(int N) { return std::min(DBIAS_MAX_SPLITS, ceil_div(N, DBIAS_ROWS_PER_SPLIT)); }
// The GELU matmul's backward (wgmma engine) sums dpre's columns per slice of this many rows.
constexpr int DGELU_COLSUM_ROWS = 64;

inline int dgelu_colsum_slices(int N) { return ceil_div(N, DGELU_COLSUM_ROWS); }

// The flash backward's workspace: dbias's split partials (S, OC) for any OC up to max_OC; or, for the bias
// gradient of the matmul that made pre, the GELU matmul's slice sums (ceil(N / 64), gelu_OC) and then their split
// partials (gelu_OC: the width of that matmul's dinp, 4C, not the LM head's Vp).
inline size_t matmul_backward_workspace_bytes(Variant v, int N, int max_OC, int gelu_OC) {
    if (v == Variant::naive) return 0;
    const int slices = dgelu_colsum_slices(N);
    return std::max(ws_round((size_t)dbias_splits(N) * max_OC * sizeof(float)),
                    ws_round((size_t)slices * gelu_OC * sizeof(float)) +
                        ws_round((size_t)dbias_splits(slices) * gelu_OC * sizeof(float)));
}

template <class T>
static __global__ void __launch_bounds__(DBIAS_WARPS * 32)
    matmul_backward_dbias_kernel(floatX* dbias, float* partial, const T* x, int N, int OC) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    constexpr int V = Packed128<T>::size, COLS = DBIAS_COLS<T>;
    __shared__ float sums[DBIAS_WARPS][COLS];
    __shared__ bool last;  // this block is its column group's last to finish stage 1
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, split = blockIdx.y, S = gridDim.y;
    const int col0 = blockIdx.x * COLS, oc = col0 + lane * V;  // this lane's V columns
    const int rows = ceil_div(N, S), r0 = split * rows, r1 = min(N, r0 + rows);
    float acc[V] = {};
    if (oc < OC) {
#pragma unroll 4
        for (int n = r0 + warp; n < r1; n += DBIAS_WARPS) {
            const Packed128<T> d = load128(x + (size_t)n * OC + oc);
            for (int e = 0; e < V; e++) acc[e] += to_float(d[e]);
        }
    }
    for (int e = 0; e < V; e++) sums[warp][lane * V + e] = acc[e];
    __syncthreads();  // every warp's column sums are in shared memory before they are added across warps
    const int c = col0 + threadIdx.x;  // the one column of the group this thread adds, if any
    const bool mine = threadIdx.x < COLS && c < OC;
    if (mine) {
        float s = 0.0f;
        for (int w = 0; w < DBIAS_WARPS; w++) s += sums[w][threadIdx.x];  // fixed order: deterministic
        partial[(size_t)split * OC + c] = s;
    }
    __threadfence();  // this thread's partial is visible to the whole GPU before the block's arrival is counted
    __syncthreads();  // every thread's partial is written and fenced before thread 0 counts the block
    if (threadIdx.x == 0) {
        last = atomicAdd(&dbias_arrivals[blockIdx.x], 1u) == (unsigned)S - 1;
        if (last) dbias_arrivals[blockIdx.x] = 0;  // all S have arrived: ready for the next call
    }
    __syncthreads();  // `last` is set before any thread reads it
    if (!last || !mine) return;
    __threadfence();  // the other blocks' partials, fenced before their arrivals, are read after ours was counted
    float s = 0.0f;
    for (int i = 0; i < S; i++) s += __ldcg(partial + (size_t)i * OC + c);  // fixed order; from L2, not a stale L1
    dbias[c] = from_float<floatX>(to_float(dbias[c]) + s);
}

// dbias (OC) += the column sums of x (N, OC), through the kernel above; ws holds its (S, OC) partials.
template <class T>
inline void colsum_flash(floatX* dbias, void* ws, const T* x, int N, int OC, cudaStream_t stream) {
    constexpr int V = Packed128<T>::size;
    if (OC % V != 0 || !aligned16(x))
        fail("matmul_backward_flash: dbias reads 16-byte rows: OC=%d must be a multiple of %d and its input 16-byte "
             "aligned", OC, V);
    const int S = dbias_splits(N), groups = ceil_div(OC, DBIAS_COLS<T>);
    if (groups > DBIAS_MAX_GROUPS)
        fail("matmul_backward_flash: dbias of OC=%d columns: at most %d", OC, DBIAS_MAX_GROUPS * DBIAS_COLS<T>);
    float* partial = WorkspaceCarver(ws).take<float>((size_t)S * OC);  // (S, OC)
    launch_dependent(matmul_backward_dbias_kernel<T>, dim3(groups, S), DBIAS_WARPS * 32, 0, stream, dbias, partial, x,
                     N, OC);
}

// pre_gelu != nullptr: dinp is multiplied by gelu'(pre_gelu) in the epilogue (CUBLASLT_EPILOGUE_DGELU, or the
// wgmma engine's, as gelu_matmul_engine(engine, C, OC) picks). dbias_pre != nullptr (with pre_gelu): += the column
// sums of that dinp, the bias gradient of the matmul that made pre_gelu. The wgmma engine sums them in its epilogue
// (one fp32 row per 64 rows of dinp, then the kernel above adds those), so dinp is not read back; on cuBLASLt the
// column sum reads dinp.
inline void matmul_backward_flash(floatX* dinp, floatX* dw, floatX* dbias, void* ws, const floatX* dout,
                                  const floatX* inp, const floatX* w, const floatX* pre_gelu, int N, int C, int OC,
                                  cudaStream_t stream, MatmulEngine engine = MatmulEngine::best,
                                  floatX* dbias_pre = nullptr) {
    const bool wgmma = pre_gelu && gelu_matmul_engine(engine, C, OC) == MatmulEngine::wgmma;
#if !defined(ENABLE_FP32)
    if (wgmma) {
        static_assert(DGELU_COLSUM_ROWS == wgmma_matmul::BM / 2, "a consumer warpgroup's slice of the engine's tile");
        WorkspaceCarver carve(ws);
        float* slices = dbias_pre ? carve.take<float>((size_t)dgelu_colsum_slices(N) * C) : nullptr;  // (N / 64, C)
        matmul_backward_dgelu_wgmma(dinp, slices, pre_gelu, dout, w, N, C, OC, stream);
        if (dbias_pre) colsum_flash(dbias_pre, carve.p, slices, dgelu_colsum_slices(N), C, stream);
    }
#endif
    // dinp^T (C, N) = (w as (C,OC)) @ (dout as (OC,N))
    if (!wgmma)
        cublaslt_matmul(dinp, w, dout, C, N, OC, false, false, C, OC, C, 0.0f,
                        pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr, pre_gelu, C, stream);
    // dw^T (C, OC) += (inp as (C,N)) @ (dout as (OC,N))^T
    cublaslt_matmul(dw, inp, dout, C, OC, N, false, true, C, OC, C, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr,
                    0, stream);
    if (dbias) colsum_flash(dbias, ws, dout, N, OC, stream);
    if (dbias_pre && !wgmma) colsum_flash(dbias_pre, ws, dinp, N, C, stream);
}

}  // namespace flashgpt2
