// Per-layer GPU tests: every layer's naive and flash kernels, forward and backward, against the Eigen
// oracle (flashgpt2::ref, in double) on fresh random inputs shifted away from zero mean, with every output
// poisoned (NaN) first, at sizes that are multiples of no tile (layer_shapes.h). The precision rule is in
// gpu_check.h. Attention and matmul have their own files (test_attention*.cu, test_matmul.cu). Each flash
// backward is also run twice: bit-identical.
#include "test/gpu/gpu_check.h"
#include "test/gpu/layer_shapes.h"  // Shape, SHAPES, VARIANTS, ws_bytes

#include "llmc/ref/ref.h"

using namespace flashgpt2;
using namespace flashgpt2::gtest;

// ---------------------------------------------------------------------------------------------------------
TEST_CASE("kernel registry: --kernels, per-layer overrides, attention engines, bad names") {
    KernelSet ks = KernelSet::all("naive");
    CHECK(ks.str() == "naive");
    ks.set("attention", "flash");
    CHECK(ks[Layer::attention] == Variant::flash);
    CHECK(ks[Layer::matmul] == Variant::naive);
    CHECK(ks.attention_engine == AttnEngine::best);
    CHECK(ks.str().find("attention=flash") != std::string::npos);
    ks.set("attention", "flash:fp32");  // an engine by name: flash, with that engine
    CHECK(ks[Layer::attention] == Variant::flash);
    CHECK(ks.attention_engine == AttnEngine::fp32);
    CHECK(ks.str().find("attention=flash:fp32") != std::string::npos);
    ks.set("attention", "naive");  // naive forgets the engine
    CHECK(ks.attention_engine == AttnEngine::best);
    CHECK(KernelSet{} == KernelSet::all(Variant::flash));  // default: all flash, the best engine
    CHECK_THROWS_WITH_AS(ks.set("softmax", "flash"), doctest::Contains("--softmax: unknown layer"), Error);
    CHECK_THROWS_WITH_AS(ks.set("gelu", "fast"), doctest::Contains("unknown kernel variant 'fast'"), Error);
    CHECK_THROWS_WITH_AS(ks.set("attention", "flash:tpu"), doctest::Contains("unknown attention engine 'tpu'"), Error);
    CHECK_THROWS_WITH_AS(ks.set("matmul", "flash:mma"), doctest::Contains("unknown matmul engine 'mma'"), Error);
    CHECK_THROWS_WITH_AS(ks.set("gelu", "flash:wgmma"), doctest::Contains("unknown kernel variant"), Error);
    ks.set("matmul", "flash:cublaslt");
    CHECK(ks.matmul_engine == MatmulEngine::cublaslt);
    CHECK(ks.str().find("matmul=flash:cublaslt") != std::string::npos);
    ks.set("matmul", "flash");  // plain flash forgets the engine
    CHECK(ks.matmul_engine == MatmulEngine::best);
    CHECK_THROWS_AS(KernelSet::all("fastest"), Error);
    CHECK_THROWS_WITH_AS(check_kernel_support(KernelSet{}, 96, 2), doctest::Contains("head size 48"), Error);
    CHECK_NOTHROW(check_kernel_support(KernelSet::all(Variant::naive), 96, 2));  // naive takes any head size
    CHECK_THROWS_AS(check_kernel_support(KernelSet{}, 100, 3), Error);           // heads must divide channels
    KernelSet flash_but_attention = KernelSet{};
    flash_but_attention.set("attention", "naive");  // 34 channels: not a whole number of 16-byte vectors
    CHECK_THROWS_WITH_AS(check_kernel_support(flash_but_attention, 34, 2), doctest::Contains("multiple of"), Error);
    KernelSet only_matmul_flash = KernelSet::all(Variant::naive);  // the flash matmul's dbias reads 16-byte rows too
    only_matmul_flash.set("matmul", "flash");
    CHECK_THROWS_WITH_AS(check_kernel_support(only_matmul_flash, 34, 2), doctest::Contains("--matmul naive"), Error);
    CHECK_NOTHROW(check_kernel_support(KernelSet::all(Variant::naive), 34, 2));
    // the flash layernorm backward's accumulators fit up to 2304 channels (GPT-2 XL has 1600)
    CHECK_NOTHROW(check_kernel_support(KernelSet{}, 2304, 36));
    CHECK_THROWS_WITH_AS(check_kernel_support(KernelSet{}, 2560, 40), doctest::Contains("--layernorm naive"), Error);
    KernelSet ln_naive = KernelSet{};
    ln_naive.set("layernorm", "naive");
    CHECK_NOTHROW(check_kernel_support(ln_naive, 2560, 40));

    // An engine that cannot run is one clear error, never a silent fallback: mma at head size 128 (it runs 64
    // only), wgmma at 32 (64 and 128 only), and in the FP32 build every tensor-core engine.
    KernelSet mma = KernelSet{}, wgmma = KernelSet{};
    mma.set("attention", "flash:mma");
    wgmma.set("attention", "flash:wgmma");
    CHECK_THROWS_WITH_AS(check_kernel_support(mma, 256, 2), doctest::Contains("flash:mma"), Error);
    CHECK_THROWS_WITH_AS(check_kernel_support(wgmma, 64, 2), doctest::Contains("flash:wgmma"), Error);
    if (BF16_BUILD && device_is_sm90()) CHECK_NOTHROW(check_kernel_support(wgmma, 256, 2));  // both passes at 128
    else CHECK_THROWS_WITH_AS(check_kernel_support(wgmma, 256, 2), doctest::Contains("flash:wgmma"), Error);
    if (BF16_BUILD) {
        CHECK_NOTHROW(check_kernel_support(mma, 128, 2));
        CHECK(attention_kernels_str(mma, 64) == "flash (forward mma, backward mma)");
    } else {
        CHECK_THROWS_WITH_AS(check_kernel_support(mma, 128, 2), doctest::Contains("BF16 build"), Error);
        CHECK(attention_kernels_str(KernelSet{}, 64) == "flash (forward fp32, backward fp32)");
    }
    CHECK(attention_kernels_str(KernelSet::all(Variant::naive), 64) == "naive");

    char* text = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    print_kernel_registry(f);
    fclose(f);
    const std::string listing(text, len);
    free(text);
    for (const char* layer : LAYER_NAMES) CHECK(listing.find(layer) != std::string::npos);
    CHECK(listing.find("attention_{forward,backward}_flash") != std::string::npos);
    for (const char* engine : {"flash:wgmma", "flash:mma", "flash:fp32"})  // --list-kernels prints every engine
        CHECK_MESSAGE(listing.find(engine) != std::string::npos, engine);
}

// ---------------------------------------------------------------------------------------------------------
TEST_CASE("encoder: forward and backward, naive and flash") {
    for (const Shape& s : SHAPES) {
        const int B = s.B, T = s.T, C = s.C, N = B * T, maxT = T + 5, Vp = s.Vp;
        const std::string tag = name_of(s);
        Rng rng(seed_for("encoder " + tag));
        auto wte = random_x((size_t)Vp * C, rng), wpe = random_x((size_t)maxT * C, rng);
        auto tokens = random_tokens(N, std::min(s.V, 13), rng);  // few distinct tokens: long runs to sum
        auto dout = random_x((size_t)N * C, rng);
        auto dwte0 = random_x((size_t)Vp * C, rng), dwpe0 = random_x((size_t)maxT * C, rng);  // += into these

        std::vector<double> out_ref((size_t)N * C), dwte_ref = dwte0, dwpe_ref = dwpe0;
        ref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
        ref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B, T, C);

        Dev<floatX> d_wte(wte.size()), d_wpe(wpe.size()), d_out(out_ref.size()), d_dout(dout.size());
        Dev<floatX> d_dwte(wte.size()), d_dwpe(wpe.size());
        Dev<int> d_tok(N);
        Dev<char> ws(ws_bytes(s));
        put(d_wte, wte), put(d_wpe, wpe), put(d_dout, dout), put(d_tok, tokens);
        std::vector<double> out[2], dwte[2], dwpe[2];
        for (int k = 0; k < 2; k++) {
            const KernelSet ks = KernelSet::all(VARIANTS[k]);
            d_out.poison();
            encoder_forward(ops(ks), d_out, d_tok, d_wte, d_wpe, B, T, C);
            out[k] = get(d_out);
            put(d_dwte, dwte0), put(d_dwpe, dwpe0);
            encoder_backward(ops(ks, ws), d_dwte, d_dwpe, d_dout, d_tok, B, T, C, Vp);
            dwte[k] = get(d_dwte), dwpe[k] = get(d_dwpe);
        }
        check_naive_flash("encoder out " + tag, out[0], out[1], out_ref);
        check_naive_flash("encoder dwte " + tag, dwte[0], dwte[1], dwte_ref);
        check_naive_flash("encoder dwpe " + tag, dwpe[0], dwpe[1], dwpe_ref);

        // flash backward: deterministic
        put(d_dwte, dwte0), put(d_dwpe, dwpe0);
        encoder_backward(ops(KernelSet{}, ws), d_dwte, d_dwpe, d_dout, d_tok, B, T, C, Vp);
        const auto first = bytes(d_dwte);
        put(d_dwte, dwte0), put(d_dwpe, dwpe0);
        encoder_backward(ops(KernelSet{}, ws), d_dwte, d_dwpe, d_dout, d_tok, B, T, C, Vp);
        CHECK_MESSAGE(first == bytes(d_dwte), "encoder_backward_flash is not deterministic " << tag);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Wider rows for layernorm: several 256-channel sweeps (BF16; 128 in FP32) and a partial last one; the second
// with enough rows (1200: 150 blocks of 8) that the backward grid is cut to one wave (one block per SM holds
// this C's accumulators: ln_bwd_grid).
const Shape LN_EXTRA_SHAPES[] = {{2, 9, 1288, 1, 50, 64}, {2, 600, 1288, 1, 50, 64}};

TEST_CASE("layernorm and residual: forward (plain and fused), backward, naive and flash") {
    std::vector<Shape> shapes(std::begin(SHAPES), std::end(SHAPES));
    shapes.insert(shapes.end(), std::begin(LN_EXTRA_SHAPES), std::end(LN_EXTRA_SHAPES));
    for (const Shape& s : shapes) {
        const int N = s.B * s.T, C = s.C;
        const size_t NC = (size_t)N * C;
        const std::string tag = name_of(s);
        Rng rng(seed_for("layernorm " + tag));
        auto a = random_x(NC, rng, 0.5, 2.0), r2 = random_x(NC, rng, -0.2, 1.0);
        auto w = random_x(C, rng, 1.0, 0.2), b = random_x(C, rng, 0.1, 0.2);

        // residual_ref = a + r2 exactly; the GPU stores it rounded, which is part of each kernel's error.
        std::vector<double> res_ref(NC), out_ref(NC), res_out_ref(NC), mean_ref(N), rstd_ref(N), m2(N), s2(N);
        for (size_t i = 0; i < NC; i++) res_ref[i] = a[i] + r2[i];
        ref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), a.data(), w.data(), b.data(), N, C);
        ref::layernorm_forward(res_out_ref.data(), m2.data(), s2.data(), res_ref.data(), w.data(), b.data(), N, C);

        Dev<floatX> d_a(NC), d_r2(NC), d_w(C), d_b(C), d_out(NC), d_res(NC);
        Dev<float> d_mean(N), d_rstd(N);
        put(d_a, a), put(d_r2, r2), put(d_w, w), put(d_b, b);
        std::vector<double> out[2], mean[2], rstd[2], res[2], res_out[2], res_mean[2];
        for (int k = 0; k < 2; k++) {
            const KernelSet ks = KernelSet::all(VARIANTS[k]);
            d_out.poison(), d_mean.poison(), d_rstd.poison();
            layernorm_forward(ops(ks), d_out, d_mean, d_rstd, d_a, d_w, d_b, N, C);
            out[k] = get(d_out), mean[k] = get(d_mean), rstd[k] = get(d_rstd);
            d_out.poison(), d_res.poison(), d_mean.poison();
            residual_layernorm_forward(ops(ks), d_res, d_out, d_mean, d_rstd, d_a, d_r2, d_w, d_b, N, C);
            res[k] = get(d_res), res_out[k] = get(d_out), res_mean[k] = get(d_mean);
        }
        check_naive_flash("layernorm out " + tag, out[0], out[1], out_ref);
        check_naive_flash("layernorm mean " + tag, mean[0], mean[1], mean_ref);
        check_naive_flash("layernorm rstd " + tag, rstd[0], rstd[1], rstd_ref);
        check_naive_flash("residual_layernorm residual " + tag, res[0], res[1], res_ref);
        check_naive_flash("residual_layernorm out " + tag, res_out[0], res_out[1], res_out_ref);
        check_naive_flash("residual_layernorm mean " + tag, res_mean[0], res_mean[1], m2);

        // Mixed sets take the unfused path with one flash and one naive kernel.
        for (const char* layer : {"residual", "layernorm"}) {
            KernelSet mixed;
            mixed.set(layer, "naive");
            d_out.poison(), d_res.poison();
            residual_layernorm_forward(ops(mixed), d_res, d_out, d_mean, d_rstd, d_a, d_r2, d_w, d_b, N, C);
            check_naive_flash(std::string("residual_layernorm out, ") + layer + " naive " + tag, res_out[0],
                              get(d_out), res_out_ref);
        }

        // Standalone residual over a count that is not a multiple of the 16-byte vector (the tail path).
        const size_t n_odd = NC - 3;
        std::vector<double> sum_ref(n_odd), sum[2];
        for (size_t i = 0; i < n_odd; i++) sum_ref[i] = a[i] + r2[i];
        Dev<floatX> d_sum(n_odd);
        for (int k = 0; k < 2; k++) {
            d_sum.poison();
            residual_forward(ops(KernelSet::all(VARIANTS[k])), d_sum, d_a, d_r2, n_odd);
            sum[k] = get(d_sum);
        }
        check_naive_flash("residual_forward " + tag, sum[0], sum[1], sum_ref);

        // backward, with the oracle's mean/rstd (as fp32) as the saved statistics; dinp, dw, db and dsum (the
        // column sums of the finished dinp) accumulate.
        auto dout = random_x(NC, rng), dinp0 = random_x(NC, rng), dw0 = random_x(C, rng), db0 = random_x(C, rng);
        auto ds0 = random_x(C, rng);
        std::vector<double> mean_f(N), rstd_f(N);
        for (int i = 0; i < N; i++) mean_f[i] = (float)mean_ref[i], rstd_f[i] = (float)rstd_ref[i];
        std::vector<double> dinp_ref = dinp0, dw_ref = dw0, db_ref = db0, ds_ref = ds0;
        ref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), a.data(), w.data(),
                                mean_f.data(), rstd_f.data(), N, C);
        for (size_t i = 0; i < NC; i++) ds_ref[i % C] += dinp_ref[i];
        Dev<floatX> d_dout(NC), d_dinp(NC), d_dw(C), d_db(C), d_ds(C);
        Dev<char> ws(ws_bytes(s));
        put(d_dout, dout), put(d_mean, mean_f), put(d_rstd, rstd_f);
        std::vector<double> dinp[2], dw[2], db[2], ds[2];
        std::vector<unsigned char> first, first_db, first_ds, first_dinp;
        for (int k = 0; k < 3; k++) {  // naive, flash, flash again (determinism)
            const KernelSet ks = KernelSet::all(VARIANTS[std::min(k, 1)]);
            put(d_dinp, dinp0), put(d_dw, dw0), put(d_db, db0), put(d_ds, ds0);
            layernorm_backward(ops(ks, ws), d_dinp, d_dw, d_db, d_ds, d_dout, d_a, d_w, d_mean, d_rstd, N, C);
            if (k < 2) dinp[k] = get(d_dinp), dw[k] = get(d_dw), db[k] = get(d_db), ds[k] = get(d_ds);
            if (k == 1) first = bytes(d_dw), first_db = bytes(d_db), first_ds = bytes(d_ds), first_dinp = bytes(d_dinp);
            if (k == 2) CHECK_MESSAGE((first == bytes(d_dw) && first_db == bytes(d_db) && first_ds == bytes(d_ds)),
                                      "layernorm_backward_flash is not deterministic " << tag);
        }
        check_naive_flash("layernorm dinp " + tag, dinp[0], dinp[1], dinp_ref);
        check_naive_flash("layernorm dw " + tag, dw[0], dw[1], dw_ref);
        check_naive_flash("layernorm db " + tag, db[0], db[1], db_ref);
        check_naive_flash("layernorm dsum " + tag, ds[0], ds[1], ds_ref);
        // without dsum: dinp the same bits, dsum not written
        put(d_dinp, dinp0), d_ds.poison();
        const std::vector<unsigned char> poisoned = bytes(d_ds);
        layernorm_backward(ops(KernelSet::all(Variant::flash), ws), d_dinp, d_dw, d_db, nullptr, d_dout, d_a, d_w,
                           d_mean, d_rstd, N, C);
        CHECK_MESSAGE(bytes(d_ds) == poisoned, "layernorm_backward_flash wrote dsum it was not given " << tag);
        CHECK_MESSAGE(bytes(d_dinp) == first_dinp, "layernorm_backward_flash: dinp differs without dsum " << tag);
    }
}

// ---------------------------------------------------------------------------------------------------------
TEST_CASE("gelu: forward and backward (also in place), naive and flash") {
    Rng rng(seed_for("gelu"));
    const size_t n = 3 * 1000 + 5;  // not a multiple of the 16-byte vector
    auto x = random_x(n, rng, 0.2, 2.5), dout = random_x(n, rng);
    std::vector<double> y_ref(n), dx_ref(n, 0.0);
    ref::gelu_forward(y_ref.data(), x.data(), (int)n);
    ref::gelu_backward(dx_ref.data(), x.data(), dout.data(), (int)n);
    Dev<floatX> d_x(n), d_y(n), d_dout(n), d_dx(n);
    put(d_x, x), put(d_dout, dout);
    std::vector<double> y[2], dx[2], dx_inplace[2];
    for (int k = 0; k < 2; k++) {
        const KernelSet ks = KernelSet::all(VARIANTS[k]);
        d_y.poison(), d_dx.poison();
        gelu_forward(ops(ks), d_y, d_x, n);
        gelu_backward(ops(ks), d_dx, d_x, d_dout, n);
        y[k] = get(d_y), dx[k] = get(d_dx);
        put(d_dx, dout);
        gelu_backward(ops(ks), d_dx, d_x, d_dx, n);  // dinp == dout
        dx_inplace[k] = get(d_dx);
    }
    check_naive_flash("gelu out", y[0], y[1], y_ref);
    check_naive_flash("gelu dinp", dx[0], dx[1], dx_ref);
    check_naive_flash("gelu dinp in place", dx_inplace[0], dx_inplace[1], dx_ref);
}

// ---------------------------------------------------------------------------------------------------------
TEST_CASE("classifier: softmax + cross-entropy + dlogits, naive and flash") {
    // besides the layer shapes, two long rows: GPT-2's vocabulary (50,257 of 50,304: each of the 1024 threads
    // takes several 16-byte chunks, the last one partial) and a longer one (60,001 of 60,008). The flash kernel
    // copies a row of up to CLASSIFIER_SMEM_ROW_BYTES to shared memory and reads a longer one from global memory
    // twice: the layer shapes take the first path, the 60,008 row the second (and in the FP32 build GPT-2's too).
    std::vector<Shape> shapes(std::begin(SHAPES), std::end(SHAPES));
    shapes.push_back({1, 3, 96, 3, 50257, 50304});
    shapes.push_back({2, 2, 96, 3, 60001, 60008});
    REQUIRE(classifier_row_in_smem(SHAPES[0].Vp));  // both of the flash kernel's paths are taken below
    REQUIRE(!classifier_row_in_smem(60008));
    for (const Shape& s : shapes) {
        const int B = s.B, T = s.T, N = B * T, V = s.V, Vp = s.Vp;
        const std::string tag = name_of(s) + " V=" + std::to_string(V);
        Rng rng(seed_for("classifier " + tag));
        auto logits = random_x((size_t)N * Vp, rng, 0.3, 2.0);
        for (int n = 0; n < N; n++)
            for (int v = V; v < Vp; v++) logits[(size_t)n * Vp + v] = 50.0;  // padding must be ignored
        auto targets = random_tokens(N, V, rng);
        const float scale = 1.0f / N;

        std::vector<double> losses_ref(N), probs((size_t)N * Vp), dlogits_ref((size_t)N * Vp, 0.0), dl(N, scale);
        ref::crossentropy_softmax_forward(losses_ref.data(), probs.data(), logits.data(), targets.data(), B, T, V, Vp);
        ref::crossentropy_softmax_backward(dlogits_ref.data(), dl.data(), probs.data(), targets.data(), B, T, V, Vp);

        Dev<floatX> d_logits(logits.size());
        Dev<float> d_losses(N);
        Dev<int> d_targets(N);
        Dev<char> ws(ws_bytes(s));
        put(d_targets, targets);
        std::vector<double> losses[2], dlogits[2], losses_only[2];
        for (int k = 0; k < 2; k++) {
            const KernelSet ks = KernelSet::all(VARIANTS[k]);
            put(d_logits, logits), d_losses.poison();
            fused_classifier(ops(ks, ws), d_logits, d_losses, d_targets, B * T, V, Vp, scale, false);  // loss only
            losses_only[k] = get(d_losses);
            CHECK_MESSAGE(get(d_logits) == logits, "classifier without dlogits changed the logits " << tag);
            d_losses.poison();
            fused_classifier(ops(ks, ws), d_logits, d_losses, d_targets, B * T, V, Vp, scale, true);
            losses[k] = get(d_losses), dlogits[k] = get(d_logits);
        }
        check_naive_flash("classifier losses " + tag, losses[0], losses[1], losses_ref);
        check_naive_flash("classifier losses (no dlogits) " + tag, losses_only[0], losses_only[1], losses_ref);
        check_naive_flash("classifier dlogits " + tag, dlogits[0], dlogits[1], dlogits_ref);
        bool pad_zero = true;
        for (int k = 0; k < 2; k++)
            for (int n = 0; n < N; n++)
                for (int v = V; v < Vp; v++) pad_zero = pad_zero && dlogits[k][(size_t)n * Vp + v] == 0.0;
        CHECK_MESSAGE(pad_zero, "padded columns must get exactly zero gradient " << tag);
    }
}

// ---------------------------------------------------------------------------------------------------------
TEST_CASE("adamw and the global gradient norm, naive and flash") {
    GPT2Config cfg;  // a tiny model: 16 tensors of odd sizes, decayed and not
    cfg.max_seq_len = 7, cfg.vocab_size = 11, cfg.padded_vocab_size = 16, cfg.num_layers = 2, cfg.num_heads = 1,
    cfg.channels = 12;
    const ParamLayout layout = ParamLayout::gpt2(cfg);
    const size_t n = layout.total();
    REQUIRE(n == num_parameters(cfg));
    Rng rng(seed_for("adamw"));
    auto master = random_f(n, rng, 0.05, 0.5), grads = random_x(n, rng, 0.01, 0.1);
    auto m0 = random_f(n, rng, 0.0, 0.01), v0 = random_f(n, rng, 0.0, 0.01);
    for (auto& x : v0) x = std::fabs(x);
    AdamWHyper hp;
    hp.lr = 1e-2f, hp.weight_decay = 0.1f, hp.t = 3, hp.grad_scale = 0.7f;

    // oracle (llmc/ref/adamw.h), with the clipping scale applied to the gradients first
    std::vector<double> master_ref = master, scaled(n);
    for (size_t i = 0; i < n; i++) scaled[i] = grads[i] * hp.grad_scale;
    std::vector<float> m_ref(m0.begin(), m0.end()), v_ref(v0.begin(), v0.end());
    ref::AdamW rhp;
    rhp.lr = hp.lr, rhp.beta1 = hp.beta1, rhp.beta2 = hp.beta2, rhp.eps = hp.eps, rhp.weight_decay = hp.weight_decay;
    ref::adamw_update(master_ref, scaled, m_ref, v_ref, cfg, rhp, hp.t);
    const std::vector<double> m_refd(m_ref.begin(), m_ref.end()), v_refd(v_ref.begin(), v_ref.end());

    Dev<float> d_master(n), d_m(n), d_v(n), d_norm(1);
    Dev<floatX> d_params(n), d_grads(n);
    Dev<char> ws(global_norm_workspace_bytes(Variant::naive));
    put(d_grads, grads);
    std::vector<double> out_master[2], out_params[2], out_m[2], out_v[2], norm[2];
    for (int k = 0; k < 2; k++) {
        const KernelSet ks = KernelSet::all(VARIANTS[k]);
        put(d_master, master), put(d_params, master), put(d_m, m0), put(d_v, v0);
        adamw_update(ops(ks), d_master, d_params, d_grads, d_m, d_v, layout, hp);
        out_master[k] = get(d_master), out_params[k] = get(d_params), out_m[k] = get(d_m), out_v[k] = get(d_v);
        d_norm.poison();
        global_norm_squared(ops(ks, ws), d_norm, d_grads, layout);
        norm[k] = get(d_norm);
    }
    check_naive_flash("adamw master weights", out_master[0], out_master[1], master_ref);
    check_naive_flash("adamw params (floatX)", out_params[0], out_params[1], rounded_x(master_ref));
    check_naive_flash("adamw m", out_m[0], out_m[1], m_refd);
    check_naive_flash("adamw v", out_v[0], out_v[1], v_refd);
    const double norm_ref = ref::global_grad_norm(grads);
    check_naive_flash("global norm squared", norm[0], norm[1], {norm_ref * norm_ref});

    // flash norm: deterministic
    global_norm_squared(ops(KernelSet{}, ws), d_norm, d_grads, layout);
    const auto first = bytes(d_norm);
    global_norm_squared(ops(KernelSet{}, ws), d_norm, d_grads, layout);
    CHECK(first == bytes(d_norm));

    // The clip factor taken on the device from the norm² (hp.norm2, the trainer's way) against the same update
    // with the factor computed here by llm.c's rule: the same bytes. A norm² that is NaN or infinite moves nothing.
    const float clip = 1.5f;
    for (int k = 0; k < 2; k++) {
        const KernelSet ks = KernelSet::all(VARIANTS[k]);
        auto step = [&](const AdamWHyper& h) {
            put(d_master, master), put(d_params, master), put(d_m, m0), put(d_v, v0);
            adamw_update(ops(ks), d_master, d_params, d_grads, d_m, d_v, layout, h);
            return std::vector<std::vector<unsigned char>>{bytes(d_master), bytes(d_params), bytes(d_m), bytes(d_v)};
        };
        for (float norm2 : {4.0f, 0.36f, 7.3f}) {  // norm 2 and 2.70…: clipped; 0.6: not
            AdamWHyper on_host = hp, on_device = hp;
            const float norm = std::sqrt(norm2);
            on_host.grad_scale = norm > clip ? clip / norm : 1.0f;
            put(d_norm, std::vector<float>{norm2});
            on_device.norm2 = d_norm, on_device.grad_clip = clip;
            CHECK_MESSAGE(step(on_device) == step(on_host), variant_name(VARIANTS[k]), " norm² ", norm2);
        }
        put(d_master, master), put(d_params, master), put(d_m, m0), put(d_v, v0);
        const std::vector<std::vector<unsigned char>> before{bytes(d_master), bytes(d_params), bytes(d_m), bytes(d_v)};
        for (float bad : {NAN, INFINITY}) {
            AdamWHyper on_device = hp;
            put(d_norm, std::vector<float>{bad});
            on_device.norm2 = d_norm, on_device.grad_clip = clip;
            CHECK_MESSAGE(step(on_device) == before, variant_name(VARIANTS[k]), " norm² ", bad);
        }
    }

#if defined(ENABLE_FP32)
    // FP32 build without master weights: params are updated in place.
    for (int k = 0; k < 2; k++) {
        put(d_params, master), put(d_m, m0), put(d_v, v0);
        adamw_update(ops(KernelSet::all(VARIANTS[k])), nullptr, d_params, d_grads, d_m, d_v, layout, hp);
        out_params[k] = get(d_params);
    }
    check_naive_flash("adamw params without master", out_params[0], out_params[1], master_ref);
#else
    CHECK_THROWS_AS(adamw_update(ops(KernelSet{}), nullptr, d_params, d_grads, d_m, d_v, layout, hp), Error);
#endif
}
