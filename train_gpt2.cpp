// The CPU trainer: a tiny GPT-2 trained on TinyShakespeare with the Eigen reference model (llmc/ref).
// It is what `make train` runs on a machine without a CUDA GPU, and the shortest path through the whole
// loop the CUDA trainer (train_gpt2.cu) runs at scale:
//   batch -> forward (loss) -> backward (gradients) -> clip -> AdamW with a cosine schedule -> repeat,
//   with a validation loss every few steps, checkpoints, and a sample of generated text at the end.
// The default run (4 layers, 4 heads, 64 channels, B=8, T=64, 400 steps) takes the loss from ~10.9 (ln 50257: a uniform
// guess) to below 6 in a few minutes on two cores. `./build/train_gpt2 --help` lists every flag.
//
// Reliability, the same rules as the CUDA trainer's (doc/reliability.md):
//   - everything that can fail on bad input fails before the first step, with one line: flags, the init file,
//     the data, the tokenizer, and the output directory (created and written to: a permission problem says so);
//   - -o DIR gets a checkpoint every -n steps and at the end (llmc/checkpoint.h: model + state + DONE marker),
//     and --resume continues from the newest complete one bit-exactly, after checking that every setting that
//     shapes the run is the one recorded in DIR/run_settings.txt (llmc/run_record.h);
//   - a NaN or infinite loss, gradient norm or val loss stops the run before the update (llmc/guard.h), so the
//     newest checkpoint stays the last good state; --spike-z skips the updates of loss spikes.
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
#include <set>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/checkpoint.h"
#include "llmc/checksum.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/fault.h"
#include "llmc/guard.h"
#include "llmc/init.h"
#include "llmc/logger.h"
#include "llmc/ref/ref.h"
#include "llmc/run_record.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;

namespace {

struct Options {
    std::string train_glob = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_glob = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer = "data/gpt2_tokenizer.bin";
    std::string init;  // dN (a random GPT-2 of depth N) or a checkpoint to start from; empty: --layers/--heads/--channels
    int max_seq_len = 0;  // position table rows; 0 = T (or the checkpoint's)
    std::string out_dir = "log/cpu";
    int layers = 4, heads = 4, channels = 64;
    int B = 8, T = 64, steps = 400, warmup = 10;
    float lr = 5e-3f, final_frac = 0.1f, weight_decay = 0.0f, grad_clip = 1.0f, spike_z = 0.0f;
    int val_every = 50, val_batches = 8, checkpoint_every = 100;
    int gen_tokens = 64, top_k = 40;
    float temperature = 0.9f;
    uint64_t seed = 1337;
    bool resume = false, overwrite = false;
};

const char* USAGE = R"(usage: train_gpt2 [flags]   (the CPU trainer; every flag has a default)
  -i GLOB           train token shards             [%s]
  -j GLOB           validation token shards        [%s]
  --tokenizer PATH  tokenizer, to print samples    [%s]
  -e INIT           dN: a random GPT-2 of depth N (as the GPU trainer's -e; its shape replaces --layers/--heads/
                    --channels), or an llm.c checkpoint to start from (its shape wins)
  --max-seq-len N   position table rows (default: T; a checkpoint's shorter table is extended)
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
  --spike-z Z       skip the update of a step whose loss is Z standard deviations above the last 64 steps'
                    mean, as llm.c's -sl (0: off)  [%g]
  -v N              validation loss every N steps (0: never) [%d]
  -m N              validation batches per check   [%d]
  -g N              tokens to sample at the end (0: none) [%d]
  --top-k K         sample from the K most likely tokens (0: all) [%d]
  --temperature X   sampling temperature (0: greedy) [%g]
  -n N              checkpoint every N steps (0: only at the end, -1: never) [%d]
  -o DIR            output directory: checkpoints, main.log, run_settings.txt [%s]
  --resume          continue bit-exactly from the newest complete checkpoint in DIR (same settings)
  --overwrite       start afresh in a DIR that holds another run's checkpoints (deletes them)
  --seed N          init, data order (llm.c's streams), sampling [%llu]
  -h, --help        this text
)";

void print_usage(const Options& o) {
    std::printf(USAGE, o.train_glob.c_str(), o.val_glob.c_str(), o.tokenizer.c_str(), o.layers, o.heads,
                o.channels, o.B, o.T, o.steps, o.lr, o.warmup, o.final_frac, o.weight_decay, o.grad_clip, o.spike_z,
                o.val_every, o.val_batches, o.gen_tokens, o.top_k, o.temperature, o.checkpoint_every,
                o.out_dir.c_str(), (unsigned long long)o.seed);
}

using args::parse_float;
using args::parse_int;

// Returns nullopt when --help was asked for. A flag given twice, or a flag where a value should be
// ("-o --resume"), is an error rather than a silent override.
std::optional<Options> parse_args(int argc, char** argv) {
    Options o;
    const int I = 1 << 30;
    std::map<std::string, std::function<void(const std::string&)>> flags = {
        {"-i", [&](const std::string& v) { o.train_glob = v; }},
        {"-j", [&](const std::string& v) { o.val_glob = v; }},
        {"--tokenizer", [&](const std::string& v) { o.tokenizer = v; }},
        {"-e", [&](const std::string& v) { o.init = v; }},
        {"--max-seq-len", [&](const std::string& v) { o.max_seq_len = (int)parse_int("--max-seq-len", v, 1, 1 << 20); }},
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
        {"--spike-z", [&](const std::string& v) { o.spike_z = parse_float("--spike-z", v, 0.0, 1e6); }},
        {"-v", [&](const std::string& v) { o.val_every = (int)parse_int("-v", v, 0, I); }},
        {"-m", [&](const std::string& v) { o.val_batches = (int)parse_int("-m", v, 1, I); }},
        {"-g", [&](const std::string& v) { o.gen_tokens = (int)parse_int("-g", v, 0, I); }},
        {"--top-k", [&](const std::string& v) { o.top_k = (int)parse_int("--top-k", v, 0, I); }},
        {"--temperature", [&](const std::string& v) { o.temperature = parse_float("--temperature", v, 0.0, 100.0); }},
        {"-n", [&](const std::string& v) { o.checkpoint_every = (int)parse_int("-n", v, -1, I); }},
        {"-o", [&](const std::string& v) { o.out_dir = v; }},
        {"--seed", [&](const std::string& v) { o.seed = (uint64_t)parse_int("--seed", v, 0, UINT32_MAX); }},  // llm.c's 32-bit generators
    };
    const std::map<std::string, bool*> switches = {{"--resume", &o.resume}, {"--overwrite", &o.overwrite}};
    std::set<std::string> seen;
    for (int a = 1; a < argc; a++) {
        const std::string flag = argv[a];
        if (flag == "-h" || flag == "--help") {
            print_usage(o);
            return std::nullopt;
        }
        if (!seen.insert(flag).second) fail("%s: given twice", flag.c_str());
        if (auto sw = switches.find(flag); sw != switches.end()) {
            *sw->second = true;
            continue;
        }
        auto it = flags.find(flag);
        if (it == flags.end()) fail("%s: unknown flag (see --help)", flag.c_str());
        if (a + 1 >= argc) fail("%s: missing its value (see --help)", flag.c_str());
        const std::string value = argv[++a];
        if (flags.count(value) || switches.count(value) || value == "-h" || value == "--help")
            fail("%s: missing its value (the next argument, %s, is a flag)", flag.c_str(), value.c_str());
        it->second(value);
    }
    if (o.out_dir.empty()) fail("-o: the output directory must not be empty");
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

// Every setting that shapes this run's trajectory, for DIR/run_settings.txt (llmc/run_record.h).
// (The val split is not in it: it changes what is reported, not what is trained.)
RunRecord run_record(const Options& o, const GPT2Config& cfg, const std::vector<float>& init_params,
                     const DataLoader& train_data) {
    RunRecord r;
    r.set("trainer", std::string("train_gpt2 (CPU, Eigen reference, fp32)"));
    r.set("kernels", std::string("cpu reference"));
    r.set("model", config_str(cfg));
    char init[96];
    if (init_params.empty()) snprintf(init, sizeof init, "random (seed %llu)", (unsigned long long)o.seed);
    else snprintf(init, sizeof init, "checkpoint, parameters crc32c %08x",
                  crc32c(init_params.data(), init_params.size() * sizeof(float)));
    r.set("init", std::string(init));
    r.set("train_data", train_data.fingerprint());
    r.set("batch", (long long)o.B), r.set("seq_len", (long long)o.T), r.set("steps", (long long)o.steps);
    record_recipe(r, o.lr, o.warmup, o.final_frac, o.weight_decay, o.grad_clip, o.spike_z, o.seed);
    return r;
}

// The one-process, whole-model layout of the CPU trainer's optimizer state (no master weights: fp32 throughout).
StateLayout cpu_layout(const GPT2Config& cfg) {
    StateLayout lay;
    lay.config = cfg;
    lay.num_params = num_parameters(cfg);
    lay.begin = 0, lay.end = lay.num_params;
    return lay;
}

// The model and everything a resume needs to continue bit-exactly.
struct Trainer {
    ref::GPT2<float> model;
    std::vector<float> m, v;  // AdamW moments
    SpikeGuard guard;
    explicit Trainer(const GPT2Config& cfg, float spike_z)
        : model(cfg), m(model.params.size(), 0.0f), v(model.params.size(), 0.0f), guard(spike_z) {}
};

// Checkpoint `step` in dir: model file (+ checksum), state file, then the DONE marker. A failure part way
// removes this step's files, so the previous checkpoint stays the newest, and nothing half-made is left.
void save_checkpoint_cpu(const std::string& dir, int step, const Trainer& t, const DataLoader& train_data,
                         const Options& o) {
    TrainState st;
    st.step = step, st.B = o.B, st.T = o.T, st.total_batch = (int64_t)o.B * o.T, st.seed = o.seed;
    st.loader = train_data.state();
    st.guard = t.guard.state;
    const std::string model_file = checkpoint_path(dir, "model", step);
    try {
        save_checkpoint(model_file, t.model.config, t.model.params.data());
        write_state_file(checkpoint_path(dir, "state", step), st, cpu_layout(t.model.config), t.m.data(), t.v.data(),
                         nullptr);
        write_file_atomic(checkpoint_path(dir, "DONE", step), std::string());
    } catch (const Error&) {
        std::error_code ec;
        for (const std::string& f : {model_file, checksum_path(model_file), checkpoint_path(dir, "state", step)})
            std::filesystem::remove(f, ec);
        throw;
    }
}

// Restores the checkpoint of `step`: weights (checksum required), optimizer moments, guard window, data position.
// The loader must then stand exactly where `step` batches leave it (one batch per step here).
void resume_checkpoint(const std::string& dir, int64_t step, Trainer& t, DataLoader& train_data) {
    const std::string model_file = checkpoint_path(dir, "model", step), state_file = checkpoint_path(dir, "state", step);
    std::vector<float> params;
    const GPT2Config c = load_checkpoint(model_file, params, /*require_checksum=*/true);
    if (!same_config(c, t.model.config))
        fail("%s: holds %s, the run is %s", model_file.c_str(), config_str(c).c_str(), config_str(t.model.config).c_str());
    const StateFile sf = read_state_file(state_file);
    check_state_layout(state_file, sf.layout, cpu_layout(t.model.config));
    if (sf.state.step != step) fail("%s: holds step %lld, its name says %lld", state_file.c_str(), (long long)sf.state.step, (long long)step);
    train_data.restore(sf.state.loader, state_file);
    if (train_data.batches_read() != (uint64_t)step)
        fail("%s: the data position is %llu batches in, but %lld steps read %lld", state_file.c_str(),
             (unsigned long long)train_data.batches_read(), (long long)step, (long long)step);
    t.model.params = std::move(params);
    std::memcpy(t.m.data(), sf.m(), t.m.size() * sizeof(float));
    std::memcpy(t.v.data(), sf.v(), t.v.size() * sizeof(float));
    t.guard.state = sf.state.guard;
}

int train(const Options& o) {
    // 1. Everything that can fail on bad input fails here, before any training and before anything is written:
    // the model's shape (a random GPT-2 of the requested shape, or a checkpoint whose shape wins), the data,
    // the tokenizer, then the output directory.
    GPT2Config cfg;
    cfg.vocab_size = 50257, cfg.padded_vocab_size = 50304;
    cfg.num_layers = o.layers, cfg.num_heads = o.heads, cfg.channels = o.channels;
    if (const auto preset = config_from_depth(o.init)) cfg = *preset;  // -e dN: GPT-2's shape at depth N
    cfg.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : o.T;
    std::vector<float> init_params;
    if (!o.init.empty() && !config_from_depth(o.init)) {
        const GPT2Config file = load_checkpoint(o.init, init_params);
        if (o.max_seq_len > 0 && o.max_seq_len < file.max_seq_len)
            fail("--max-seq-len %d: %s has a position table of %d rows; a table can grow, not shrink", o.max_seq_len,
                 o.init.c_str(), file.max_seq_len);
        cfg = file;
        if (o.max_seq_len > file.max_seq_len) {  // the new rows drawn as GPT-2's init draws them (llmc/init.h)
            cfg.max_seq_len = o.max_seq_len;
            init_params = extend_position_table(init_params, file, cfg, o.seed);
        }
    }
    validate_config(cfg, "model flags (-e, --layers/--heads/--channels, --max-seq-len)");
    if (o.T > cfg.max_seq_len)
        fail("-t: T=%d exceeds the model's max_seq_len %d (its position table's rows): add --max-seq-len %d", o.T,
             cfg.max_seq_len, o.T);
    std::optional<Tokenizer> tok;
    if (o.gen_tokens > 0) {
        tok = Tokenizer::load(o.tokenizer);
        if ((int)tok->vocab_size > cfg.vocab_size)
            fail("%s: %u tokens, more than the model's vocab %d", o.tokenizer.c_str(), tok->vocab_size, cfg.vocab_size);
    }
    DataLoader train_data(o.train_glob, o.B, o.T, /*shuffle=*/true, o.seed, cfg.vocab_size);
    std::optional<DataLoader> val_data;
    if (o.val_every > 0) val_data.emplace(o.val_glob, o.B, o.T, /*shuffle=*/false, 0, cfg.vocab_size);
    const int val_batches = val_data ? std::min<int>(o.val_batches, (int)val_data->num_batches()) : 0;
    const int64_t resume_step =
        open_run_dir(o.out_dir, run_record(o, cfg, init_params, train_data), o.resume, o.overwrite);

    // 2. The model and its optimizer state: fresh, or the newest complete checkpoint.
    Trainer t(cfg, o.spike_z);
    int first_step = 0;
    if (resume_step >= 0) {
        resume_checkpoint(o.out_dir, resume_step, t, train_data);
        first_step = (int)resume_step;
    } else if (init_params.empty()) {
        t.model.init_random(o.seed);  // llmc/init.h: llm.c's draws for this seed
    } else {
        t.model.params = std::move(init_params);
    }
    ref::GPT2<float>& model = t.model;
    ref::AdamW hp;
    hp.weight_decay = o.weight_decay;
    Logger log((std::filesystem::path(o.out_dir) / "main.log").string(), /*append=*/resume_step >= 0);

    std::printf("model: L=%d NH=%d C=%d maxT=%d V=%d (Vp %d), %.2fM parameters\n", cfg.num_layers, cfg.num_heads,
                cfg.channels, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, num_parameters(cfg) / 1e6);
    std::printf("data: B=%d T=%d, %zu train batches per epoch", o.B, o.T, train_data.num_batches());
    if (val_data) std::printf(", val on %d batches (%d tokens)", val_batches, val_batches * o.B * o.T);
    std::printf("\ntrain: %d steps, lr %g (warm-up %d, cosine to %g x), wd %g, clip %g", o.steps, o.lr, o.warmup,
                o.final_frac, o.weight_decay, o.grad_clip);
    if (o.spike_z > 0) std::printf(", loss spikes above z %g skipped", o.spike_z);
    std::printf("\noutput: %s (log: %s/main.log, one line per step)", o.out_dir.c_str(), o.out_dir.c_str());
    if (resume_step >= 0) std::printf(" (resumed at step %d)", first_step);
    std::printf("\n");

    // 3. The loop, in the CUDA trainer's order: at step s the model has had s updates; evaluate, checkpoint,
    // then train step s. The last pass (s = steps) only evaluates and writes the final checkpoint.
    const double t_start = now_ms();
    double train_ms = 0;
    std::optional<float> last_val;
    std::vector<float> losses;  // this session's train losses, for the summary
    for (int step = first_step; step <= o.steps; step++) {
        const bool last = step == o.steps;
        std::optional<float> val;
        if (val_data && (step % o.val_every == 0 || last)) {
            val = last_val = fault_value("nan-val", step, validation_loss(model, *val_data, val_batches));
            require_finite(step, "validation loss", *val);
        }
        const bool periodic = o.checkpoint_every > 0 && step > first_step && step % o.checkpoint_every == 0;
        if (periodic || (last && o.checkpoint_every >= 0 && step > first_step))
            save_checkpoint_cpu(o.out_dir, step, t, train_data, o);
        if (last) {
            if (val) log.log_val(step, *val);
            break;
        }

        const double t0 = now_ms();
        train_data.next_batch();
        const float loss = fault_value("spike-loss", step, fault_value("nan-loss", step,
            model.forward(train_data.inputs.data(), train_data.targets.data(), o.B, o.T)));
        require_finite(step, "training loss", loss);
        model.zero_grad();
        model.backward();
        const float norm = fault_value("nan-norm", step, ref::clip_grads(model.grads, o.grad_clip));
        require_finite(step, "gradient norm", norm);
        fault_point(step);
        const SpikeVerdict spike = t.guard.check(loss);
        hp.lr = lr_cosine(step, o.steps, o.lr, o.warmup, o.final_frac);
        if (!spike.skip) ref::adamw_update(model.params, model.grads, t.m, t.v, cfg, hp, step + 1);
        const double ms = now_ms() - t0;
        train_ms += ms;

        losses.push_back(loss);
        const double tok_s = o.B * o.T / (ms / 1000.0);
        char note[64] = "";
        if (spike.skip) snprintf(note, sizeof note, "skipped lossz %.2f", spike.z);
        std::printf("step %4d/%d | train loss %.4f", step + 1, o.steps, loss);
        if (val) std::printf(" | val loss %.4f", *val);
        const double elapsed = (now_ms() - t_start) / 1000.0;
        const double eta = elapsed / (step + 1 - first_step) * (o.steps - step - 1);  // at this run's pace so far
        std::printf(" | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s | %s elapsed, ETA %s", hp.lr, norm, ms, tok_s,
                    duration_str(elapsed).c_str(), duration_str(eta).c_str());
        if (spike.skip) std::printf(" | update skipped: loss z-score %.2f > %g", spike.z, o.spike_z);
        std::printf("\n");
        std::fflush(stdout);
        log.log_step(step, loss, val, hp.lr, norm, ms, tok_s, note);
    }
    // one batch's loss is noisy (±0.3 at B*T=256), so the summary averages the last 20 steps
    if (last_val) std::printf("final val loss %.4f\n", *last_val);
    if (!losses.empty()) {
        const int tail = std::min<int>(20, (int)losses.size());
        double tail_mean = 0;
        for (size_t i = losses.size() - tail; i < losses.size(); i++) tail_mean += losses[i] / tail;
        std::printf("train loss %.4f at step %d -> %.4f (mean of the last %d steps)\n", losses.front(), first_step + 1,
                    tail_mean, tail);
        std::printf("time: %.1f s training (%.0f ms/step), %.1f s in all\n", train_ms / 1000, train_ms / losses.size(),
                    (now_ms() - t_start) / 1000);
    }
    if (o.checkpoint_every >= 0) std::printf("checkpoint: %s\n", checkpoint_path(o.out_dir, "model", o.steps).c_str());
    if (tok) sample_text(model, *tok, o, o.gen_tokens);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        const std::optional<Options> o = parse_args(argc, argv);
        return o ? train(*o) : 0;
    });
}
