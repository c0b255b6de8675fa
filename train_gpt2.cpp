// The CPU trainer: a tiny GPT-2 trained on TinyShakespeare with the Eigen reference model (llmc/ref).
// It is what `make train` runs on a machine without a CUDA GPU, and the shortest path through the whole
// loop the CUDA trainer (train_gpt2.cu) runs at scale:
//   batch -> forward (loss) -> backward (gradients) -> clip -> AdamW with a cosine schedule -> repeat,
//   with a validation loss every few steps, an llm.c checkpoint at the end, and a sample of generated text.
// The default run (4 layers, 4 heads, 64 channels, B=8, T=64, 400 steps) takes the loss from ~10.9 (ln 50257: a uniform
// guess) to below 6 in a few minutes on two cores. `./build/train_gpt2 --help` lists every flag.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/logger.h"
#include "llmc/ref/ref.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;

namespace {

struct Options {
    std::string train_glob = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_glob = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer = "data/gpt2_tokenizer.bin";
    std::string init;  // a checkpoint to start from instead of a random init
    std::string checkpoint = "checkpoints/cpu_model.bin";
    std::string log = "log/train_cpu.log";
    int layers = 4, heads = 4, channels = 64;
    int B = 8, T = 64, steps = 400, warmup = 10;
    float lr = 5e-3f, final_frac = 0.1f, weight_decay = 0.0f, grad_clip = 1.0f;
    int val_every = 50, val_batches = 8;
    int gen_tokens = 64, top_k = 40;
    float temperature = 0.9f;
    uint64_t seed = 1337;
};

const char* USAGE = R"(usage: train_gpt2 [flags]   (the CPU trainer; every flag has a default)
  -i GLOB           train token shards             [%s]
  -j GLOB           validation token shards        [%s]
  --tokenizer PATH  tokenizer, to print samples    [%s]
  -e PATH           start from this llm.c checkpoint instead of a random init (its shape wins)
  --layers N        transformer blocks             [%d]
  --heads N         attention heads                [%d]
  --channels N      model width C                  [%d]
  -b N              batch size B                   [%d]
  -t N              sequence length T              [%d]
  -x N              training steps                 [%d]
  -l LR             peak learning rate             [%g]
  -u N              warm-up steps                  [%d]
  -q FRAC           final lr as a fraction of peak [%g]
  -c WD             AdamW weight decay             [%g]
  --grad-clip G     clip the global grad norm (0: off) [%g]
  -v N              validation loss every N steps  [%d]
  -m N              validation batches per check   [%d]
  -g N              tokens to sample at the end (0: none) [%d]
  --top-k K         sample from the K most likely tokens (0: all) [%d]
  --temperature X   sampling temperature (0: greedy) [%g]
  -o PATH           checkpoint written at the end  [%s]
  --log PATH        one line per step ('' : none)  [%s]
  --seed N          init, data order (llm.c's streams), sampling [%llu]
  -h, --help        this text
)";

void print_usage(const Options& o) {
    std::printf(USAGE, o.train_glob.c_str(), o.val_glob.c_str(), o.tokenizer.c_str(), o.layers, o.heads,
                o.channels, o.B, o.T, o.steps, o.lr, o.warmup, o.final_frac, o.weight_decay, o.grad_clip,
                o.val_every, o.val_batches, o.gen_tokens, o.top_k, o.temperature, o.checkpoint.c_str(),
                o.log.c_str(), (unsigned long long)o.seed);
}

// Strict number parsing: the whole string must be the number ("-b 4x" is an error, not 4).
long long parse_int(const std::string& flag, const std::string& s, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE) fail("%s: '%s' is not an integer", flag.c_str(), s.c_str());
    if (v < lo || v > hi) fail("%s: %lld is out of range [%lld, %lld]", flag.c_str(), v, lo, hi);
    return v;
}

float parse_float(const std::string& flag, const std::string& s, double lo, double hi) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        fail("%s: '%s' is not a number", flag.c_str(), s.c_str());
    if (v < lo || v > hi) fail("%s: %g is out of range [%g, %g]", flag.c_str(), v, lo, hi);
    return (float)v;
}

// Returns nullopt when --help was asked for.
std::optional<Options> parse_args(int argc, char** argv) {
    Options o;
    const int I = 1 << 30;
    std::map<std::string, std::function<void(const std::string&)>> flags = {
        {"-i", [&](const std::string& v) { o.train_glob = v; }},
        {"-j", [&](const std::string& v) { o.val_glob = v; }},
        {"--tokenizer", [&](const std::string& v) { o.tokenizer = v; }},
        {"-e", [&](const std::string& v) { o.init = v; }},
        {"--layers", [&](const std::string& v) { o.layers = (int)parse_int("--layers", v, 1, 1024); }},
        {"--heads", [&](const std::string& v) { o.heads = (int)parse_int("--heads", v, 1, 1 << 16); }},
        {"--channels", [&](const std::string& v) { o.channels = (int)parse_int("--channels", v, 1, 1 << 16); }},
        {"-b", [&](const std::string& v) { o.B = (int)parse_int("-b", v, 1, 1 << 16); }},
        {"-t", [&](const std::string& v) { o.T = (int)parse_int("-t", v, 1, 1 << 20); }},
        {"-x", [&](const std::string& v) { o.steps = (int)parse_int("-x", v, 1, I); }},
        {"-l", [&](const std::string& v) { o.lr = parse_float("-l", v, 0.0, 10.0); }},
        {"-u", [&](const std::string& v) { o.warmup = (int)parse_int("-u", v, 0, I); }},
        {"-q", [&](const std::string& v) { o.final_frac = parse_float("-q", v, 0.0, 1.0); }},
        {"-c", [&](const std::string& v) { o.weight_decay = parse_float("-c", v, 0.0, 10.0); }},
        {"--grad-clip", [&](const std::string& v) { o.grad_clip = parse_float("--grad-clip", v, 0.0, 1e30); }},
        {"-v", [&](const std::string& v) { o.val_every = (int)parse_int("-v", v, 1, I); }},
        {"-m", [&](const std::string& v) { o.val_batches = (int)parse_int("-m", v, 1, I); }},
        {"-g", [&](const std::string& v) { o.gen_tokens = (int)parse_int("-g", v, 0, I); }},
        {"--top-k", [&](const std::string& v) { o.top_k = (int)parse_int("--top-k", v, 0, I); }},
        {"--temperature", [&](const std::string& v) { o.temperature = parse_float("--temperature", v, 0.0, 100.0); }},
        {"-o", [&](const std::string& v) { o.checkpoint = v; }},
        {"--log", [&](const std::string& v) { o.log = v; }},
        {"--seed", [&](const std::string& v) { o.seed = (uint64_t)parse_int("--seed", v, 0, UINT32_MAX); }},  // llm.c's 32-bit generators
    };
    for (int a = 1; a < argc; a++) {
        const std::string flag = argv[a];
        if (flag == "-h" || flag == "--help") {
            print_usage(o);
            return std::nullopt;
        }
        auto it = flags.find(flag);
        if (it == flags.end()) fail("%s: unknown flag (see --help)", flag.c_str());
        if (a + 1 >= argc) fail("%s: missing its value (see --help)", flag.c_str());
        it->second(argv[++a]);
    }
    if (o.checkpoint.empty()) fail("-o: the checkpoint path must not be empty");
    return o;
}

// Mean loss over the first n batches of the validation split (from its start, so every check is comparable).
float validation_loss(ref::GPT2<float>& model, DataLoader& val, int n) {
    val.reset();
    double sum = 0;
    for (int i = 0; i < n; i++) {
        val.next_batch();
        sum += model.forward(val.inputs.data(), val.targets.data(), val.B, val.T);
    }
    return (float)(sum / n);
}

// Generates n tokens after <|endoftext|>, printing them as they come. Each token reruns the model on the
// last T tokens (no KV cache here: the CPU model is tiny; the CUDA trainer keeps one).
void sample_text(ref::GPT2<float>& model, const Tokenizer& tok, const Options& o, int n) {
    Rng rng(o.seed ^ 0x5A3D1E);
    std::vector<int> ids = {(int)tok.eot_token};
    const int maxT = model.config.max_seq_len, V = model.config.vocab_size;
    std::printf("---- sample (%d tokens, top-k %d, temperature %g) ----\n", n, o.top_k, o.temperature);
    for (int i = 0; i < n; i++) {
        const int len = std::min((int)ids.size(), maxT);
        model.forward(ids.data() + ids.size() - len, nullptr, 1, len);
        const int next = sample_top_k(model.logits_at(0, len - 1), V, o.top_k, o.temperature, rng);
        ids.push_back(next);
        std::fputs(tok.decode(next).c_str(), stdout);
        std::fflush(stdout);
    }
    std::printf("\n---------------------------------------------------------\n");
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

int train(const Options& o) {
    // The model: a random GPT-2 of the requested shape, or a checkpoint (whose shape wins).
    GPT2Config cfg;
    cfg.max_seq_len = o.T, cfg.vocab_size = 50257, cfg.padded_vocab_size = 50304;
    cfg.num_layers = o.layers, cfg.num_heads = o.heads, cfg.channels = o.channels;
    std::vector<float> init_params;
    if (!o.init.empty()) cfg = load_checkpoint(o.init, init_params);
    validate_config(cfg, "model flags (--layers/--heads/--channels)");
    if (o.T > cfg.max_seq_len)
        fail("-t: T=%d exceeds the model's max_seq_len %d (from %s)", o.T, cfg.max_seq_len, o.init.c_str());

    // Everything that can fail on bad input fails here, before any training: the checkpoint's directory
    // must be writable, the data and tokenizer files must be there and valid.
    {
        std::error_code ec;
        const auto parent = std::filesystem::path(o.checkpoint).parent_path();
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        const std::string probe = o.checkpoint + ".tmp";
        std::FILE* f = std::fopen(probe.c_str(), "wb");
        if (!f) fail("-o %s: cannot write there: %s", o.checkpoint.c_str(), std::strerror(errno));
        std::fclose(f);
        std::remove(probe.c_str());
    }
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    if ((int)tok.vocab_size > cfg.vocab_size)
        fail("%s: %u tokens, more than the model's vocab %d", o.tokenizer.c_str(), tok.vocab_size, cfg.vocab_size);
    DataLoader train_data(o.train_glob, o.B, o.T, /*shuffle=*/true, o.seed, cfg.vocab_size);
    DataLoader val_data(o.val_glob, o.B, o.T, /*shuffle=*/false, 0, cfg.vocab_size);
    const int val_batches = std::min<int>(o.val_batches, (int)val_data.num_batches());

    ref::GPT2<float> model(cfg);
    if (init_params.empty()) model.init_random(o.seed);
    else model.params = std::move(init_params);
    std::vector<float> m(model.params.size(), 0.0f), v(model.params.size(), 0.0f);  // AdamW state
    ref::AdamW hp;
    hp.weight_decay = o.weight_decay;
    Logger log(o.log);

    std::printf("model: L=%d NH=%d C=%d maxT=%d V=%d (Vp %d), %.2fM parameters\n", cfg.num_layers, cfg.num_heads,
                cfg.channels, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, num_parameters(cfg) / 1e6);
    std::printf("data: B=%d T=%d, %zu train batches per epoch, val on %d batches (%d tokens)\n", o.B, o.T,
                train_data.num_batches(), val_batches, val_batches * o.B * o.T);
    std::printf("train: %d steps, lr %g (warm-up %d, cosine to %g x), wd %g, clip %g\n", o.steps, o.lr, o.warmup,
                o.final_frac, o.weight_decay, o.grad_clip);

    const double t_start = now_ms();
    double train_ms = 0;
    float first_loss = NAN, last_val = NAN;
    std::vector<float> losses;  // every step's train loss, for the summary
    for (int step = 0; step < o.steps; step++) {
        std::optional<float> val;
        if (step % o.val_every == 0) val = last_val = validation_loss(model, val_data, val_batches);

        const double t0 = now_ms();
        train_data.next_batch();
        const float loss = model.forward(train_data.inputs.data(), train_data.targets.data(), o.B, o.T);
        if (!std::isfinite(loss)) fail("step %d: the loss is %f: training diverged (try a lower -l)", step, loss);
        model.zero_grad();
        model.backward();
        const float norm = ref::clip_grads(model.grads, o.grad_clip);
        hp.lr = lr_cosine(step, o.steps, o.lr, o.warmup, o.final_frac);
        ref::adamw_update(model.params, model.grads, m, v, cfg, hp, step + 1);
        const double ms = now_ms() - t0;
        train_ms += ms;

        if (step == 0) first_loss = loss;
        losses.push_back(loss);
        const double tok_s = o.B * o.T / (ms / 1000.0);
        std::printf("step %4d/%d | train loss %.4f", step + 1, o.steps, loss);
        if (val) std::printf(" | val loss %.4f", *val);
        std::printf(" | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s\n", hp.lr, norm, ms, tok_s);
        std::fflush(stdout);
        log.log_step(step, loss, val, hp.lr, norm, ms, tok_s);
    }
    last_val = validation_loss(model, val_data, val_batches);
    log.log_val(o.steps, last_val);
    // one batch's loss is noisy (±0.3 at B*T=256), so the summary averages the last 20 steps
    const int tail = std::min(20, o.steps);
    double tail_mean = 0;
    for (int i = o.steps - tail; i < o.steps; i++) tail_mean += losses[i] / tail;
    std::printf("final val loss %.4f | train loss %.4f at step 1 -> %.4f (mean of the last %d steps)\n", last_val,
                first_loss, tail_mean, tail);
    std::printf("time: %.1f s training (%.0f ms/step), %.1f s in all\n", train_ms / 1000, train_ms / o.steps,
                (now_ms() - t_start) / 1000);

    save_checkpoint(o.checkpoint, cfg, model.params.data());
    std::printf("checkpoint: %s\n", o.checkpoint.c_str());
    if (o.gen_tokens > 0) sample_text(model, tok, o, o.gen_tokens);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        const std::optional<Options> o = parse_args(argc, argv);
        return o ? train(*o) : 0;
    });
}
