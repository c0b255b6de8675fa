// Matmul GPU tests: the matmul layer's naive and flash kernels (cuBLASLt, and the wgmma engine of the GELU
// matmuls), forward with bias and GELU, backward with the GELU and both bias gradients, against the Eigen oracle
// (flashgpt2::ref, in double) on fresh random inputs with every output poisoned first, at the per-layer tests'
// shapes (layer_shapes.h); then --matmul-algos. The precision rule is in gpu_check.h.
#include "test/gpu/gpu_check.h"
#include "test/gpu/layer_shapes.h"  // Shape, SHAPES, ws_bytes

#include "llmc/ref/ref.h"

using namespace flashgpt2;
using namespace flashgpt2::gtest;

// ---------------------------------------------------------------------------------------------------------
// One matmul configuration: with/without bias, with/without GELU (forward: matmul_gelu_forward; backward:
// the input was gelu(pre_gelu), so dinp comes back times gelu'(pre_gelu), and its column sums are added into
// the bias gradient of the matmul that made pre_gelu, dbias_pre).
static void check_matmul(const Shape& s, int C, int OC, bool bias, bool gelu, const std::string& what) {
    const int N = s.B * s.T;
    const std::string tag = what + " " + name_of(s) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
    Rng rng(seed_for("matmul " + tag));
    auto inp = random_x((size_t)N * C, rng), w = random_x((size_t)OC * C, rng, 0.02, 0.3);
    auto bvec = bias ? random_x(OC, rng) : std::vector<double>{};
    auto pre_in = random_x((size_t)N * C, rng, 0.1, 1.5);  // for the backward: inp = gelu(pre_in)
    auto dout = random_x((size_t)N * OC, rng);
    auto dw0 = random_x((size_t)OC * C, rng), db0 = bias ? random_x(OC, rng) : std::vector<double>{};
    auto dbp0 = gelu ? random_x(C, rng) : std::vector<double>{};

    // forward oracle: out = inp w^T + b, and gelu(out)
    std::vector<double> out_ref((size_t)N * OC), gelu_ref((size_t)N * OC);
    ref::matmul_forward(out_ref.data(), inp.data(), w.data(), bias ? bvec.data() : nullptr, N, C, OC);
    ref::gelu_forward(gelu_ref.data(), out_ref.data(), N * OC);
    // backward oracle: dinp = (dout w) [* gelu'(pre_in)], dw += dout^T inp, db += colsum(dout)
    std::vector<double> bwd_inp = inp;
    if (gelu) {
        bwd_inp = std::vector<double>((size_t)N * C);
        ref::gelu_forward(bwd_inp.data(), pre_in.data(), N * C);
        bwd_inp = rounded_x(bwd_inp);  // the GPU holds gelu(pre) as floatX
    }
    std::vector<double> dinp_ref((size_t)N * C, 0.0), dw_ref = dw0, db_ref = db0, dlin((size_t)N * C, 0.0);
    ref::matmul_backward(dlin.data(), dw_ref.data(), bias ? db_ref.data() : nullptr, dout.data(), bwd_inp.data(),
                         w.data(), N, C, OC);
    if (gelu) ref::gelu_backward(dinp_ref.data(), pre_in.data(), dlin.data(), N * C);
    else dinp_ref = dlin;
    std::vector<double> dbp_ref = dbp0;  // dbias_pre += colsum(dinp)
    for (size_t e = 0; gelu && e < dinp_ref.size(); e++) dbp_ref[e % C] += dinp_ref[e];

    Dev<floatX> d_inp(inp.size()), d_w(w.size()), d_b(std::max(1, bias ? OC : 0)), d_out(out_ref.size()),
        d_pre(out_ref.size()), d_dout(dout.size()), d_dinp(inp.size()), d_dw(w.size()), d_db(std::max(1, OC)),
        d_pre_in(inp.size()), d_bwd_inp(inp.size()), d_dbp(std::max(1, C));
    Dev<char> ws(ws_bytes(s));
    put(d_inp, inp), put(d_w, w), put(d_dout, dout), put(d_pre_in, pre_in), put(d_bwd_inp, bwd_inp);
    if (bias) put(d_b, bvec);
    const floatX* b_ptr = bias ? (const floatX*)d_b : nullptr;

    // naive, flash, the mixed sets that split matmul+gelu fusions, and flash with the GELU matmuls on cuBLASLt
    // (plain flash runs them on the wgmma engine where it can: the test below checks which)
    KernelSet mm_flash_gelu_naive, mm_naive_gelu_flash = KernelSet::all(Variant::naive), mm_cublaslt;
    mm_flash_gelu_naive.set("gelu", "naive");
    mm_naive_gelu_flash.set("gelu", "flash");
    mm_cublaslt.set("matmul", "flash:cublaslt");
    const KernelSet sets[5] = {KernelSet::all(Variant::naive), KernelSet{}, mm_flash_gelu_naive, mm_naive_gelu_flash,
                               mm_cublaslt};
    std::vector<double> out[5], pre[5], dinp[5], dw[5], db[5], dbp[5];
    std::vector<unsigned char> first, first_db, first_out, first_dinp, first_dbp;
    for (int k = 0; k < 6; k++) {  // k = 5: flash again, for determinism
        const KernelSet& ks = sets[k == 5 ? 1 : k];
        d_out.poison(), d_pre.poison(), d_dinp.poison();
        if (gelu) matmul_gelu_forward(ops(ks), d_out, d_pre, d_inp, d_w, b_ptr, N, C, OC);
        else matmul_forward(ops(ks), d_out, d_inp, d_w, b_ptr, N, C, OC);
        put(d_dw, dw0);
        if (bias) put(d_db, db0);
        if (gelu) put(d_dbp, dbp0);
        matmul_backward(ops(ks, ws), d_dinp, d_dw, bias ? (floatX*)d_db : nullptr, d_dout, d_bwd_inp, d_w,
                        gelu ? (const floatX*)d_pre_in : nullptr, N, C, OC, gelu ? (floatX*)d_dbp : nullptr);
        if (k == 5) {
            CHECK_MESSAGE(first_out == bytes(d_out), "matmul forward (flash) is not deterministic " << tag);
            CHECK_MESSAGE(first_dinp == bytes(d_dinp), "matmul_backward_flash dinp is not deterministic " << tag);
            CHECK_MESSAGE(first == bytes(d_dw), "matmul_backward_flash dw is not deterministic " << tag);
            if (bias) CHECK_MESSAGE(first_db == bytes(d_db), "matmul_backward_flash dbias is not deterministic " << tag);
            if (gelu) CHECK_MESSAGE(first_dbp == bytes(d_dbp), "matmul_backward_flash dbias_pre is not deterministic " << tag);
            break;
        }
        out[k] = get(d_out), dinp[k] = get(d_dinp), dw[k] = get(d_dw);
        if (gelu) pre[k] = get(d_pre);
        if (bias) db[k] = get(d_db);
        if (gelu) dbp[k] = get(d_dbp);
        if (k == 1)
            first = bytes(d_dw), first_db = bytes(d_db), first_out = bytes(d_out), first_dinp = bytes(d_dinp),
            first_dbp = bytes(d_dbp);
    }
    const char* names[5] = {"", "", " (matmul flash, gelu naive)", " (matmul naive, gelu flash)",
                            " (matmul flash:cublaslt)"};
    for (int k = 1; k < 5; k++) {
        if (!gelu && k > 1) break;  // without GELU the mixed sets are the plain matmul again
        check_naive_flash("matmul out " + tag + names[k], out[0], out[k], gelu ? gelu_ref : out_ref);
        if (gelu) check_naive_flash("matmul pre_gelu " + tag + names[k], pre[0], pre[k], out_ref);
        check_naive_flash("matmul dinp " + tag + names[k], dinp[0], dinp[k], dinp_ref);
        check_naive_flash("matmul dw " + tag + names[k], dw[0], dw[k], dw_ref);
        if (bias) check_naive_flash("matmul dbias " + tag + names[k], db[0], db[k], db_ref);
        if (gelu) check_naive_flash("matmul dbias_pre " + tag + names[k], dbp[0], dbp[k], dbp_ref);
    }
}

TEST_CASE("matmul: forward (+bias, +GELU) and backward, naive and flash") {
    for (const Shape& s : SHAPES) {
        // `--matmul flash` must run the GELU matmuls on the wgmma engine where it can (a silent fallback would
        // leave it untested): BF16 build on an sm_90 device, 4C and C multiples of 8.
        const bool wgmma = BF16_BUILD && device_is_sm90() && s.C % 8 == 0;
        CHECK_MESSAGE(gelu_matmul_engine(MatmulEngine::best, 4 * s.C, s.C) ==
                          (wgmma ? MatmulEngine::wgmma : MatmulEngine::cublaslt), "GELU matmul engine, C=" << s.C);
        check_matmul(s, s.C, 3 * s.C, true, false, "qkv");            // bias
        check_matmul(s, s.C, 4 * s.C, true, true, "fc+gelu");         // bias + GELU epilogue
        check_matmul(s, 4 * s.C, s.C, true, true, "fcproj(dgelu)");   // backward through the GELU
        check_matmul(s, s.C, s.Vp, false, false, "lm head");          // no bias
    }
    // More GELU-engine tiles than an H100/H200 has SMs (2200 × 2592: 18 × 11 = 198 of 128 × 256 for 132), 11
    // k-slices deep: a block runs a second tile, through a ring of slots each reused within a tile.
    const Shape many{2, 1100, 648, 8, 300, 320};
    check_matmul(many, many.C, 4 * many.C, true, true, "fc+gelu");
    check_matmul(many, 4 * many.C, many.C, true, true, "fcproj(dgelu)");
}

// --matmul-algos: a call's algorithm comes from the table, one loaded from a file included, and a timed pick is
// as accurate as the heuristic's first. A long reduction (k = 8191) makes cuBLASLt offer split-K candidates,
// which round differently from its first, so that which algorithm ran shows in the output's bits.
TEST_CASE("matmul: the algorithm a table names is the one that runs (--matmul-algos)") {
    const int N = 67, C = 8191, OC = 96;
    Rng rng(seed_for("matmul algos"));
    auto inp = random_x((size_t)N * C, rng), w = random_x((size_t)OC * C, rng, 0.02, 0.3);
    std::vector<double> ref_out((size_t)N * OC);
    ref::matmul_forward<double>(ref_out.data(), inp.data(), w.data(), nullptr, N, C, OC);
    Dev<floatX> d_inp(inp.size()), d_w(w.size()), d_out(ref_out.size());
    put(d_inp, inp), put(d_w, w);
    MatmulAlgos& ma = matmul_algos();
    auto run = [&] {
        d_out.poison();
        matmul_forward(ops(KernelSet{}), d_out, d_inp, d_w, nullptr, N, C, OC);
        return bytes(d_out);
    };
    auto run_pick = [&](int pick) {  // a fresh table, the call timed, candidate `pick` taken
        ma = MatmulAlgos{};
        ma.timing = true, ma.force_pick = pick;
        auto b = run();
        ma.timing = false, ma.force_pick = -1;
        return b;
    };
    const auto first = run_pick(0);
    const std::vector<double> out_first = get(d_out);
    REQUIRE(ma.table.calls.size() == 1);
    const int candidates = ma.table.calls.begin()->second.candidates;
    int other = -1;
    std::vector<unsigned char> other_bits;
    for (int i = 1; i < candidates && other < 0; i++) {
        auto b = run_pick(i);
        const MatmulChoice& kept = ma.table.calls.begin()->second;  // candidate i, unless cuBLASLt refused it
        CHECK(kept.us > 0.0f);
        if (kept.pick == i && b != first) other = i, other_bits = b;
    }
    REQUIRE_MESSAGE(other > 0, "none of the " << candidates << " candidates rounds differently from the first: "
                                              "this test could not tell which one ran");
    check_naive_flash("matmul out, candidate " + std::to_string(other) + " against the heuristic's first", out_first,
                      get(d_out), ref_out);
    TempDir dir("algos");
    const std::string file = dir / "algos.txt";
    save_matmul_algos(file);  // the table: candidate `other` for this call
    ma = MatmulAlgos{};
    CHECK(run() == first);  // no table: the heuristic's first
    ma = MatmulAlgos{};
    load_matmul_algos(file);
    CHECK_MESSAGE(run() == other_bits, "the loaded table's algorithm (candidate " << other << ") did not run");
    // a loaded entry whose algorithm cuBLASLt does not accept for its call (one made for other data types) is
    // refused at that call, with one line that says so
    ma = MatmulAlgos{};
    load_matmul_algos(file);
    {
        const cudaDataType_t other = sizeof(floatX) == 2 ? CUDA_R_32F : CUDA_R_16BF;  // not this build's floatX
        int id = -1, ids = 0;
        REQUIRE(cublasLtMatmulAlgoGetIds(blas().lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, other, other, other, other, 1, &id,
                                         &ids) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(ids == 1);
        cublasLtMatmulAlgo_t algo;
        REQUIRE(cublasLtMatmulAlgoInit(blas().lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, other, other, other, other, id, &algo) ==
                CUBLAS_STATUS_SUCCESS);
        memcpy(ma.table.calls.begin()->second.algo.data(), &algo, sizeof algo);
    }
    CHECK_THROWS_WITH_AS(run(), doctest::Contains("does not run this call"), Error);
    // a table made elsewhere is refused, with one line that says so
    std::string text = read_file(file);
    text.replace(text.find("\ndevice ") + 8, 0, "another ");
    write_file_atomic(file, text);
    CHECK_THROWS_WITH_AS(load_matmul_algos(file), doctest::Contains("made on 'another "), Error);
    ma = MatmulAlgos{};
}
