// The small helpers both trainers share: the learning-rate schedule (llmc/schedule.h), the random
// number generator and token sampler (llmc/sampler.h), llm.c's init and shuffle streams (llmc/torch_rng.h),
// and the per-step log file (llmc/logger.h).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/logger.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/torch_rng.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
namespace fs = std::filesystem;

TEST_CASE("torch_rng: PyTorch's CPU stream and normal_ for seed 137 (the values llm.c's rand.h publishes)") {
    std::mt19937 g(137);
    for (uint32_t want : {4053805790u, 2173880614u, 380293709u, 1237255315u, 2986595568u}) CHECK(g() == want);
    // n < 16: pairs of 53-bit uniforms
    const float want8[8] = {0.7947664260864258f, 1.4369317293167114f, -0.2292192131280899f, 0.47556325793266296f,
                            -0.6334410905838013f, -0.5791953802108765f, -0.0925704762339592f, -0.8659197092056274f};
    float x[16];
    torch_normal(x, 8, 0.0f, 1.0f, g);
    for (int i = 0; i < 8; i++) CHECK(x[i] == doctest::Approx(want8[i]).epsilon(2e-6));
    CHECK(g() == 2186503452u);  // 8 normals took exactly 16 outputs
    // n >= 16: 16 uniforms, Box-Muller on the pairs (t, t+8)
    const float want16[16] = {-1.2813878059387207f, -2.646395683288574f, -0.06569503247737885f, 0.2180829495191574f,
                              -0.46536165475845337f, -0.33108410239219666f, 2.5485482215881348f, 0.10425379872322083f,
                              0.8460659980773926f, 0.9462448358535767f, -0.2913765013217926f, 0.34313806891441345f,
                              -1.1186704635620117f, -0.18305328488349915f, -2.3153159618377686f, 0.3961987793445587f};
    torch_normal(x, 16, 0.0f, 1.0f, g);
    for (int i = 0; i < 16; i++) CHECK(x[i] == doctest::Approx(want16[i]).epsilon(2e-6));
    CHECK(g() == 2756748748u);
    // mean and std scale every value; a tail (n % 16 != 0) redraws the last 16 values
    std::mt19937 a(7), b(7);
    std::vector<float> u(40), v(40);
    torch_normal(u.data(), 40, 0.0f, 1.0f, a);
    torch_normal(v.data(), 40, 3.0f, 0.5f, b);
    for (int i = 0; i < 40; i++) CHECK(v[i] == doctest::Approx(3.0f + 0.5f * u[i]).epsilon(1e-6));
    std::mt19937 c(7);
    c.discard(40 + 16);  // 40 uniforms, then 16 more for the tail
    CHECK(a() == c());
}

TEST_CASE("torch_rng: torch_permute is Fisher-Yates from the top, j = output % (i + 1)") {
    std::mt19937 g(11), h(11);
    std::vector<size_t> p(9);
    for (size_t i = 0; i < p.size(); i++) p[i] = i;
    torch_permute(p, g);
    std::vector<size_t> q = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    for (size_t i = 8; i >= 1; i--) {
        const size_t j = h() % (i + 1);
        const size_t t = q[i];
        q[i] = q[j], q[j] = t;
    }
    CHECK(p == q);
    CHECK(g() == h());  // n - 1 draws
}

TEST_CASE("lr_cosine: linear warm-up, cosine decay to final_frac * max_lr") {
    const float lr = 6e-4f, frac = 0.1f;
    const int total = 250, warm = 20;
    CHECK(lr_cosine(0, total, lr, warm, frac) == doctest::Approx(lr / 20));  // (step+1)/warmup
    CHECK(lr_cosine(9, total, lr, warm, frac) == doctest::Approx(lr * 10 / 20));
    CHECK(lr_cosine(19, total, lr, warm, frac) == doctest::Approx(lr));
    CHECK(lr_cosine(20, total, lr, warm, frac) == doctest::Approx(lr));  // decay starts at the top
    // half way through the decay: cos(pi/2) = 0, so the mean of max and min
    CHECK(lr_cosine(20 + 115, total, lr, warm, frac) == doctest::Approx((lr + frac * lr) / 2));
    CHECK(lr_cosine(total, total, lr, warm, frac) == doctest::Approx(frac * lr));
    CHECK(lr_cosine(total + 50, total, lr, warm, frac) == doctest::Approx(frac * lr));  // clamped after the end
    for (int s = warm; s < total; s++) CHECK(lr_cosine(s + 1, total, lr, warm, frac) <= lr_cosine(s, total, lr, warm, frac));
    for (int s = 0; s + 1 < warm; s++) CHECK(lr_cosine(s + 1, total, lr, warm, frac) > lr_cosine(s, total, lr, warm, frac));
    // no warm-up, and a schedule with no room to decay
    CHECK(lr_cosine(0, 100, lr, 0, frac) == doctest::Approx(lr));
    CHECK(lr_cosine(5, 5, lr, 5, frac) == doctest::Approx(frac * lr));
}

TEST_CASE("Rng: deterministic by seed, state can be saved and restored, uniform in [0,1)") {
    Rng a(42), b(42), c(43);
    bool differs = false;
    for (int i = 0; i < 100; i++) {
        const uint32_t x = a.next_u32();
        CHECK(x == b.next_u32());
        differs |= x != c.next_u32();
    }
    CHECK(differs);
    CHECK(Rng(0).state != 0);  // xorshift must never hold state 0

    Rng saved = a;  // a checkpoint stores state; a restored generator continues identically
    Rng restored(7);
    restored.state = saved.state;
    for (int i = 0; i < 10; i++) CHECK(a.next_f32() == restored.next_f32());

    double sum = 0, sum2 = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        const float u = a.next_f32();
        REQUIRE(u >= 0.0f);
        REQUIRE(u < 1.0f);
        sum += u;
        const double z = a.next_normal();
        sum2 += z * z;
    }
    // sample mean of U(0,1) has std 0.29/sqrt(n) ≈ 0.001; of z^2 (chi-square 1) std sqrt(2/n) ≈ 0.0045
    CHECK(std::abs(sum / n - 0.5) <= 0.005);
    CHECK(std::abs(sum2 / n - 1.0) <= 0.025);
}

TEST_CASE("sample_top_k: argmax at temperature 0, never outside the top k, follows the softmax") {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 3.0f, -7.0f};
    Rng rng(flashgpt2::testing::test_seed("sample_top_k: draws", 1));
    CHECK(sample_top_k(logits.data(), 7, 0, 0.0f, rng) == 3);  // tie 3.0 at ids 3 and 5: the lower id
    CHECK(sample_top_k(logits.data(), 7, 1, 1.0f, rng) == 3);  // top-1 is greedy too

    // top-3 = ids {3, 5, 1}: nothing else is ever drawn
    std::vector<int> counts(7, 0);
    for (int i = 0; i < 20000; i++) counts[sample_top_k(logits.data(), 7, 3, 1.0f, rng)]++;
    CHECK(counts[0] + counts[2] + counts[4] + counts[6] == 0);
    CHECK(counts[1] > 0);

    // with k = 0 (all) and temperature 1, frequencies follow softmax(logits): p = e^z / sum e^z
    const std::vector<float> z = {0.0f, std::log(2.0f), std::log(4.0f)};  // p = 1/7, 2/7, 4/7
    std::vector<int> c3(3, 0);
    const int n = 70000;
    for (int i = 0; i < n; i++) c3[sample_top_k(z.data(), 3, 0, 1.0f, rng)]++;
    // binomial std of each count is at most sqrt(n/4) ≈ 132; 5 std ≈ 660 = 1/7 of the smallest expected count
    CHECK(std::abs(c3[0] - n / 7) <= 660);
    CHECK(std::abs(c3[1] - 2 * n / 7) <= 660);
    CHECK(std::abs(c3[2] - 4 * n / 7) <= 660);
    // a high temperature flattens the distribution: p ∝ e^(z/T)
    std::vector<int> hot(3, 0);
    for (int i = 0; i < n; i++) hot[sample_top_k(z.data(), 3, 0, 1e6f, rng)]++;
    CHECK(std::abs(hot[0] - n / 3) <= 660);

    // the same seed draws the same tokens
    Rng r1(99), r2(99);
    for (int i = 0; i < 50; i++) CHECK(sample_top_k(logits.data(), 7, 4, 0.8f, r1) == sample_top_k(logits.data(), 7, 4, 0.8f, r2));

    const std::vector<float> bad = {1.0f, NAN};
    CHECK_THROWS_WITH_AS(sample_top_k(bad.data(), 2, 0, 1.0f, rng), doctest::Contains("NaN"), Error);
    CHECK_THROWS_AS(sample_top_k(bad.data(), 0, 0, 1.0f, rng), Error);
}

namespace {
std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
}  // namespace

TEST_CASE("Logger: one line per step, val only when given, append on resume, bad path is an Error") {
    const fs::path dir = fs::temp_directory_path() / ("flashgpt2_log_" + std::to_string(getpid()));
    fs::remove_all(dir);
    const std::string path = (dir / "run" / "train.log").string();  // parent directories are created
    {
        Logger log(path);
        log.log_step(0, 10.987654f, std::nullopt, 6e-5f, 1.5f, 812.25, 630.4);
        log.log_step(1, 9.5f, 9.25f, 1.2e-4f, 2.0f, 800.0, 640.0);
        // flushed line by line: readable while the logger is still open
        CHECK(slurp(path) ==
              "step 0 train 10.987654 lr 6e-05 norm 1.5000 ms 812.25 tok/s 630\n"
              "step 1 train 9.500000 val 9.250000 lr 0.00012 norm 2.0000 ms 800.00 tok/s 640\n");
    }
    {
        Logger log(path, /*append=*/true);
        log.log_val(2, 8.125f);
    }
    CHECK(slurp(path) ==
          "step 0 train 10.987654 lr 6e-05 norm 1.5000 ms 812.25 tok/s 630\n"
          "step 1 train 9.500000 val 9.250000 lr 0.00012 norm 2.0000 ms 800.00 tok/s 640\n"
          "step 2 val 8.125000\n");
    {
        Logger log(path);  // not appending: a fresh run starts a fresh log
        log.log_val(0, 1.0f);
    }
    CHECK(slurp(path) == "step 0 val 1.000000\n");
    {
        Logger off("");  // disabled: every call is a no-op
        off.log_step(0, 1.0f, std::nullopt, 0.1f, 0.0f, 0.0, 0.0);
    }
    fs::create_directories(dir / "adir");
    CHECK_THROWS_WITH_AS(Logger((dir / "adir").string()), doctest::Contains("adir"), Error);
    fs::remove_all(dir);
}
