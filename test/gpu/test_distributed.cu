// Data-parallel training (llmc/distributed.h, ZeRO-1 in llmc/model.cuh, the loop in train_gpt2.cu):
//
//   1. layout_slice: W optimizer slices cover every parameter exactly once, each with its tensor's decay flag;
//   2. ZeRO-1 without NCCL: two half-models (optimizer shards 0 and 1 of 2) on one GPU, fed the same batch,
//      with their slices exchanged by hand (what the all-gather does), step bit-for-bit like the whole model;
//   3. the NCCL path on one GPU (--num-gpus 1: a 1-rank communicator, ZeRO-1 with one slice) gives the plain
//      trainer's losses, val losses, samples and model file bit for bit, resumes bit-exactly, and a resume with
//      another number of GPUs stops with a clear error;
//   4. two processes (the trainer binary with --num-gpus 2) at the same global batch track the one-GPU run,
//      and a 2-GPU resume is bit-exact. Needs 2 GPUs: skipped on fewer (doctest counts it as skipped).
#define TESTING
#include "train_gpt2.cu"
#include "test/gpu/gpu_check.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

using namespace flashgpt2;
using gtest::TempDir;
using gtest::write_letter_tokenizer;
using gtest::write_random_tokens;

namespace {

GPT2Config tiny_config() {  // sizes that are multiples of no tile (like test_model.cu's small config)
    GPT2Config c;
    c.max_seq_len = 48, c.vocab_size = 997, c.padded_vocab_size = 1024, c.num_layers = 2, c.num_heads = 2, c.channels = 128;
    return c;
}


// Data, tokenizer and initial weights for a short run of the tiny model; the options of that run.
TrainOptions tiny_run(const TempDir& dir) {
    const GPT2Config c = tiny_config();
    const std::vector<float> init = gpt2_initial_weights(c, 5);
    save_checkpoint(dir / "init.bin", c, init.data());
    write_random_tokens(dir / "train.bin", 6000, c.vocab_size, 1);
    write_random_tokens(dir / "val.bin", 900, c.vocab_size, 2);
    write_letter_tokenizer(dir / "tok.bin", c.vocab_size);
    TrainOptions o;
    o.train_glob = dir / "train.bin", o.val_glob = dir / "val.bin", o.tokenizer = dir / "tok.bin";
    o.init = dir / "init.bin";
    o.B = 2, o.T = 37, o.total_batch = 2 * 2 * 37;  // 2 micro-batches per step on one GPU
    o.steps = 6, o.warmup = 2, o.lr = 1e-3f, o.val_every = 2, o.sample_every = 3, o.gen_tokens = 10;
    o.checkpoint_every = 3, o.seed = 11, o.quiet = true;
    return o;
}

bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

// "step S train X ..." lines of a main.log: step -> X (a resumed run appends: the last line of a step wins).
std::map<int, double> logged_train_losses(const std::string& path) {
    std::map<int, double> out;
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line)) {
        int step = 0;
        double loss = 0.0;
        if (sscanf(line.c_str(), "step %d train %lf", &step, &loss) == 2) out[step] = loss;
    }
    return out;
}

}  // namespace

TEST_SUITE("distributed") {

TEST_CASE("distributed: the ZeRO-1 slices cover every parameter once, with its decay flag") {
    const ParamLayout l = ParamLayout::gpt2(gpt2_124M());
    const size_t P = l.total();
    for (int W : {1, 2, 3, 7, 8}) {
        const size_t S = shard_size_for(P, W);
        CHECK(S * W >= P);
        if (W > 1) CHECK(S % 128 == 0);
        std::vector<size_t> covered(l.count, 0);
        for (int r = 0; r < W; r++) {
            const size_t begin = std::min(P, r * S), end = std::min(P, begin + S);
            const ParamLayout s = layout_slice(l, begin, end);
            CHECK(s.total() == end - begin);
            for (int t = 0; t < l.count; t++) {
                CHECK(s.decay[t] == l.decay[t]);
                covered[t] += s.offset[t + 1] - s.offset[t];
            }
        }
        for (int t = 0; t < l.count; t++) CHECK_MESSAGE(covered[t] == l.offset[t + 1] - l.offset[t], "W=" << W << " tensor " << t);
    }
    CHECK(shard_size_for(P, 1) == P);  // one GPU: no padding at all
}

TEST_CASE("distributed: two ZeRO-1 optimizer shards step bit-for-bit like the whole optimizer") {
    const GPT2Config c = tiny_config();
    const int B = 2, T = 37, STEPS = 3;
    const std::vector<float> init = gpt2_initial_weights(c, 21);
    const KernelSet ks = KernelSet::all(Variant::flash);  // deterministic: equal inputs give equal gradients
    GPT2Model whole(c, ks, B, T);
    GPT2Model half0(c, ks, B, T, 2, 0), half1(c, ks, B, T, 2, 1);
    GPT2Model* halves[2] = {&half0, &half1};
    for (GPT2Model* m : {&whole, &half0, &half1}) m->set_params(init);
    REQUIRE(half0.shard_begin == 0);
    REQUIRE(half0.shard_end == half1.shard_begin);
    REQUIRE(half1.shard_end == whole.num_params);
    Rng rng(3);
    const std::vector<int> in = gtest::random_tokens((size_t)B * T, c.vocab_size, rng);
    const std::vector<int> tg = gtest::random_tokens((size_t)B * T, c.vocab_size, rng);
    const size_t X = sizeof(floatX);
    for (int t = 1; t <= STEPS; t++) {
        for (GPT2Model* m : {&whole, &half0, &half1}) {
            m->zero_grad();
            m->forward(in.data(), tg.data(), B, T, true, 1.0f / (B * T));
            m->backward();
            // each model has its own stream, and some kernels keep a per-device counter (the dbias column sums'
            // arrivals, the persistent kernels' work counters): two models' passes must not run at once
            cudaCheck(cudaStreamSynchronize(m->stream));
        }
        const float norm = whole.update(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t);
        float shard_norm2[2];
        for (int r = 0; r < 2; r++) {
            GPT2Model& h = *halves[r];
            // the all-reduce of the squared norms, by hand: note this slice's, then put the global one in
            const float hnorm = h.update(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t, [&](float* norm2) {
                cudaCheck(cudaMemcpyAsync(&shard_norm2[r], norm2, sizeof(float), cudaMemcpyDeviceToHost, h.stream));
                cudaCheck(cudaMemcpyAsync(norm2, whole.norm2, sizeof(float), cudaMemcpyDeviceToDevice, h.stream));
            });
            CHECK(same_bits(hnorm, norm));
        }
        cudaCheck(cudaDeviceSynchronize());
        // the slices' squared norms add up to the whole (fp32 sums in another order: rounding-level agreement)
        CHECK(std::fabs(shard_norm2[0] + shard_norm2[1] - norm * norm) <= 1e-5 * norm * norm);
        // the all-gather, by hand: each half gets the other's updated slice
        for (int r = 0; r < 2; r++) {
            const GPT2Model& src = *halves[r];
            cudaCheck(cudaMemcpy(halves[1 - r]->params_memory + src.shard_begin, src.params_memory + src.shard_begin,
                                 src.shard_params() * X, cudaMemcpyDeviceToDevice));
        }
        const std::vector<float> want = whole.get_params();
        for (GPT2Model* h : halves) {
            const std::vector<float> got = h->get_params();
            CHECK_MESSAGE(memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0, "step " << t);
        }
    }
    // the optimizer state of each slice is the whole optimizer's state there
    for (GPT2Model* h : halves) {
        std::vector<float> a(h->shard_params()), b(h->shard_params());
        cudaCheck(cudaMemcpy(a.data(), h->v, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(b.data(), whole.v + h->shard_begin, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}

// Cases that need what this host may lack are skipped at registration (doctest::skip), so the summary counts them
// as skipped, never as passed.
static int gpu_count() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST_CASE("distributed: --num-gpus 1 (NCCL, ZeRO-1 with one slice) is bit-identical to the plain trainer" *
          doctest::skip(!NCCL_AVAILABLE)) {
    TempDir dir("dist");
    TrainOptions plain = tiny_run(dir);
    plain.out_dir = dir / "plain";
    TrainOptions nccl = plain;
    nccl.out_dir = dir / "nccl";
    nccl.num_gpus = 1;
    const TrainResult a = train(plain);
    const TrainResult b = train(nccl);
    REQUIRE(a.train_losses.size() == 6);
    REQUIRE(b.train_losses.size() == 6);
    for (int i = 0; i < 6; i++)
        CHECK_MESSAGE(same_bits(a.train_losses[i], b.train_losses[i]), "step " << i << ": " << a.train_losses[i] << " vs " << b.train_losses[i]);
    REQUIRE(a.val_losses.size() == b.val_losses.size());
    for (size_t i = 0; i < a.val_losses.size(); i++) CHECK(same_bits(a.val_losses[i].second, b.val_losses[i].second));
    CHECK(a.samples == b.samples);
    const std::string model6 = read_file(checkpoint_path(plain.out_dir, "model", 6));
    CHECK(read_file(checkpoint_path(nccl.out_dir, "model", 6)) == model6);
    CHECK(read_file(checkpoint_path(nccl.out_dir, "state", 6)) == read_file(checkpoint_path(plain.out_dir, "state", 6)));

    // resume on the NCCL path from step 3: the same steps 3..5 and the same final weights
    std::filesystem::remove(checkpoint_path(nccl.out_dir, "DONE", 6));
    TrainOptions again = nccl;
    again.resume = true;
    const TrainResult r = train(again);
    REQUIRE(r.train_losses.size() == 3);
    for (int i = 0; i < 3; i++) CHECK(same_bits(r.train_losses[i], a.train_losses[3 + i]));
    CHECK(read_file(checkpoint_path(nccl.out_dir, "model", 6)) == model6);
    MESSAGE("plain vs --num-gpus 1: 6 losses, " << a.val_losses.size() << " val losses, " << a.samples.size()
                                                << " samples and the model file bit-identical; resume bit-exact");

    // a resume with another number of GPUs stops before any GPU work, naming the right one
    TrainOptions two = plain;
    two.resume = true, two.num_gpus = 2, two.rank = 0, two.init_file = dir / "id";
    CHECK_THROWS_WITH_AS(train(two), doctest::Contains("resume with --num-gpus 1"), Error);
}

TEST_CASE("distributed: 2 processes at the same global batch track 1 GPU; 2-GPU resume is bit-exact" *
          doctest::skip(!NCCL_AVAILABLE || gpu_count() < 2)) {
    // the trainer binary of this precision, next to this test binary (build/)
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = '\0';
    const std::string prec = sizeof(floatX) == 2 ? "bf16" : "fp32";
    const std::string trainer = (std::filesystem::path(self).parent_path() / ("train_gpt2cu_" + prec)).string();
    REQUIRE_MESSAGE(std::filesystem::exists(trainer), trainer << " is missing: make build/train_gpt2cu_" << prec);

    TempDir dir("dist");
    TrainOptions one = tiny_run(dir);  // 1 GPU: 2 micro-batches of B=2 per step
    one.out_dir = dir / "one";
    one.checkpoint_every = -1;
    const TrainResult ref1 = train(one);
    // 2 GPUs: B=2 each, the same global batch of 148 tokens, 1 micro-batch per GPU
    const std::string out2 = dir / "two";
    const std::string cmd = trainer + " --num-gpus 2 -i " + one.train_glob + " -j " + one.val_glob + " --tokenizer " +
                            one.tokenizer + " -e " + one.init + " -b 2 -t 37 -d 148 -x 6 -u 2 -l 1e-3 -v 2 -s 3 -g 10 -n 3 " +
                            "--seed 11 -o " + out2 + " > " + (dir / "two.txt") + " 2>&1";
    REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd << "\n" << read_file(dir / "two.txt"));
    const std::map<int, double> got = logged_train_losses(out2 + "/main.log");
    REQUIRE(got.size() == 6);
#if defined(ENABLE_FP32)
    // fp32: the two runs add the same gradients in another order (rounding ~1e-7), which AdamW carries a little;
    // 2e-4 relative, as test_model.cu's fp32 AdamW tracking
    const double rel = 2e-4;
#else
    // bf16: each run rounds its gradient sum to bf16 in another order (2^-9 relative per element): 1%
    const double rel = 1e-2;
#endif
    for (int s = 0; s < 6; s++) {
        const double want = ref1.train_losses[s];
        CHECK_MESSAGE(std::fabs(got.at(s) - want) <= rel * std::fabs(want), "step " << s << ": 2 GPUs " << got.at(s) << " vs 1 GPU " << want);
    }
    // resume the 2-GPU run from step 3: the same model file at step 6
    const std::string model6 = read_file(checkpoint_path(out2, "model", 6));
    std::filesystem::remove(checkpoint_path(out2, "DONE", 6));
    REQUIRE_MESSAGE(std::system((cmd.substr(0, cmd.find(" > ")) + " --resume > " + (dir / "resume.txt") + " 2>&1").c_str()) == 0,
                    read_file(dir / "resume.txt"));
    CHECK(read_file(checkpoint_path(out2, "model", 6)) == model6);
    const std::map<int, double> resumed = logged_train_losses(out2 + "/main.log");  // steps 3..5 logged again
    for (int s = 3; s < 6; s++) CHECK(resumed.at(s) == got.at(s));
}

}  // TEST_SUITE
