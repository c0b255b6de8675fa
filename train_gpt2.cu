// train_gpt2.cu — GPT-2 training on the GPU, every layer as a naive or a flash kernel, chosen at run time.
//
// The model itself (buffers, forward, backward, AdamW) is llmc/model.cuh; this file is the training program
// around it, in the order a run goes:
//   1. pick the model: `-e d12` (random GPT-2 init of depth 12) or an llm.c checkpoint, or --resume;
//   2. plan the GPU memory and stop early with a clear message if it cannot fit;
//   3. the loop: every step (llmc/train_step.cuh), gradient accumulation over micro-batches, global-norm
//      clipping, AdamW with a cosine schedule; val loss every -v steps; a sample (KV-cache decoding) every -s
//      steps; a checkpoint (model + optimizer + data position + RNG) every -n steps and at the end; one log line
//      per step;
//   4. --compare: the same short run with all-naive then all-flash kernels, timed layer by layer.
// Data parallel over N GPUs (--num-gpus N, llmc/distributed.h): one process per GPU runs this same loop on its
// share of the batches (rank r reads global batches r, r+N, ...); after the backward the gradients are summed
// with a reduce-scatter, each rank steps its ZeRO-1 slice of the optimizer, and an all-gather shares the new
// weights. Rank 0 prints, logs, samples and writes the model file; every rank writes its optimizer slice.
// Included with TESTING defined (test/gpu/test_model.cu), it provides everything but main().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"        // defines: model files, TrainState, DONE_<step> markers
#include "llmc/checkpoint_cuda.h"   // defines: save/load of the model and optimizer state from the GPU
#include "llmc/common.cuh"          // defines: cudaCheck, floatX
#include "llmc/config.h"            // defines: GPT2Config, -e dN presets, flops_per_token
#include "llmc/dataloader.h"        // defines: DataLoader (llm.c's shards, shuffle, resumable position)
#include "llmc/distributed.h"       // defines: Distributed (NCCL, ZeRO-1), launch_ranks
#include "llmc/error.h"             // defines: fail, run_main
#include "llmc/evaluate.cuh"        // defines: evaluate, val_seq_len, generate_text
#include "llmc/fault.h"             // defines: the test hooks (FLASHGPT2_FAULT)
#include "llmc/fileio.h"            // defines: write_file_atomic
#include "llmc/guard.h"             // defines: require_finite, SpikeGuard (the divergence policy)
#include "llmc/init.h"              // defines: gpt2_initial_weights (llm.c's random init)
#include "llmc/kernels.h"           // defines: KernelSet, the layer ops, print_kernel_registry
#include "llmc/kvcache.cuh"         // defines: Decoder (sampling with a KV cache)
#include "llmc/logger.h"            // defines: Logger (main.log)
#include "llmc/model.cuh"           // defines: GPT2Model: its buffers, forward, backward, update
#include "llmc/peak.h"              // defines: the card's peak FLOP/s (MFU)
#include "llmc/profile.h"           // defines: LayerProfiler
#include "llmc/profile_report.h"    // defines: the --compare table
#include "llmc/run_record.h"        // defines: RunRecord, open_run_dir (what a resume must match)
#include "llmc/sampler.h"           // defines: Rng, sample_top_k
#include "llmc/schedule.h"          // defines: lr_cosine
#include "llmc/tokenizer.h"         // defines: Tokenizer
#include "llmc/train_options.h"     // defines: TrainOptions, parse_args, print_help
#include "llmc/train_step.cuh"      // defines: StepRunner (one optimizer step: micro-batches, norm, checks, AdamW)

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// The card and the model.

// The peak that MFU is measured against (llmc/peak.h): the bf16 matmul ceiling, or fp32's for the FP32 build,
// which runs true fp32 GEMMs (no TF32).
#if defined(ENABLE_FP32)
constexpr double PEAK_FLOPS = PEAK_FP32_TFLOPS * 1e12;
constexpr const char* PEAK_NAME = PEAK_FP32_NAME;
#else
constexpr double PEAK_FLOPS = PEAK_BF16_TFLOPS * 1e12;
constexpr const char* PEAK_NAME = PEAK_BF16_NAME;
#endif

inline void ensure_gpu(int device = 0) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fail("no CUDA GPU found (%s): this trainer needs one; `make train` runs the CPU trainer without a GPU",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device >= n) fail("--num-gpus: this process wants GPU %d but the host has %d", device, n);
    cudaCheck(cudaSetDevice(device));
}

// Bytes of GPU memory in use on the device right now (every process: context, cuBLAS, our buffers).
inline size_t gpu_memory_used() {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

// The initial weights: GPT-2's random init (the oracle's, so GPU, CPU and the tests start alike), or a file,
// whose position table --max-seq-len may lengthen (llmc/init.h's extend_position_table).
inline std::vector<float> initial_params(const TrainOptions& o, const GPT2Config& cfg) {
    if (config_from_depth(o.init)) return gpt2_initial_weights(cfg, o.seed);
    std::vector<float> params;
    const GPT2Config file = load_checkpoint(o.init, params);
    if (file.max_seq_len < cfg.max_seq_len) return extend_position_table(params, file, cfg, o.seed);
    return params;
}

// The model's config: from the checkpoint being resumed, else -e, with --max-seq-len's position table. A resumed
// checkpoint must match -e and --max-seq-len when they were given explicitly.
inline GPT2Config resolve_config(const TrainOptions& o, const std::string& resume_file) {
    std::optional<GPT2Config> depth = config_from_depth(o.init);
    GPT2Config from_e = depth ? *depth : load_checkpoint_config(o.init);
    if (o.max_seq_len > 0) {
        if (!depth && o.max_seq_len < from_e.max_seq_len)
            fail("--max-seq-len %d: %s has a position table of %d rows; a table can grow, not shrink", o.max_seq_len,
                 o.init.c_str(), from_e.max_seq_len);
        from_e.max_seq_len = o.max_seq_len;
    }
    if (resume_file.empty()) return from_e;
    const GPT2Config c = load_checkpoint_config(resume_file);
    if ((o.given.count("-e") || o.given.count("--max-seq-len")) && !same_config(c, from_e))
        fail("--resume: checkpoint config mismatch: %s holds %s but -e %s --max-seq-len %d is %s", resume_file.c_str(),
             config_str(c).c_str(), o.init.c_str(), from_e.max_seq_len, config_str(from_e).c_str());
    return c;
}

// -t beyond the position table: one line that says how to get a longer one.
inline void check_seq_len(const TrainOptions& o, const GPT2Config& cfg) {
    if (o.T > cfg.max_seq_len)
        fail("-t: T=%d exceeds the model's max_seq_len %d (its position table's rows); add --max-seq-len %d (a random "
             "init gets that many rows; a checkpoint's table is extended, the new rows drawn as GPT-2's init draws them)",
             o.T, cfg.max_seq_len, o.T);
}

// ---------------------------------------------------------------------------------------------------------
// The training run.

struct TrainResult {
    std::vector<float> train_losses;            // indexed by step - first_step
    std::vector<std::pair<int, float>> val_losses;  // (step, loss)
    std::vector<std::string> samples;               // the generated texts, in order
    int first_step = 0;
    double mean_ms = 0.0, tok_per_s = 0.0, mfu = 0.0;
    size_t peak_memory = 0, allocated = 0;
};

// Every setting that shapes this run's trajectory, for DIR/run_settings.txt (llmc/run_record.h): a --resume must
// match each one. (The val split is not in it: it changes what is reported, not what is trained.)
inline RunRecord run_record(const TrainOptions& o, const GPT2Config& cfg, const DataLoader& train_loader,
                            int tokens_per_step, int world) {
    RunRecord r;
    r.set("trainer", std::string("train_gpt2cu (GPU, ") + PRECISION_NAME + ")");
    r.set("kernels", o.kernels.str());
    if (o.matmul_algos != "heuristic") r.set("matmul_algos", o.matmul_algos);  // absent: older records match
    if (o.recompute) r.set("recompute", (long long)o.recompute);  // absent at -r 0: the records of older runs match
    r.set("model", config_str(cfg));
    char init[160];
    if (config_from_depth(o.init)) snprintf(init, sizeof init, "random %s (seed %llu)", o.init.c_str(), o.seed);
    else snprintf(init, sizeof init, "checkpoint %s", o.init.c_str());
    r.set("init", std::string(init));
    r.set("train_data", train_loader.fingerprint());
    r.set("batch", (long long)o.B), r.set("seq_len", (long long)o.T), r.set("total_batch", (long long)tokens_per_step);
    r.set("num_gpus", (long long)world), r.set("steps", (long long)o.steps);
    record_recipe(r, o.lr, o.warmup, o.final_lr_frac, o.weight_decay, o.grad_clip, o.spike_z, o.seed);
    return r;
}

// Micro-batches per step: the (global) total batch over W GPUs' B*T each.
inline int grad_accum_steps(const TrainOptions& o, int world = 1) {
    const long micro = (long)o.B * o.T * world;
    const long total = o.total_batch < 0 ? micro : o.total_batch;
    if (total % micro != 0)
        fail("-d: total batch %ld tokens is not a multiple of B*T*GPUs = %d*%d*%d = %ld", total, o.B, o.T, world, micro);
    return (int)(total / micro);
}

inline TrainResult train(const TrainOptions& o) {
    Distributed dist;  // who this process is (one GPU unless --num-gpus or a launcher says otherwise)
    dist.configure(o.num_gpus, o.rank, o.init_file);
    const bool quiet = o.quiet || !dist.is_main();
    // llmc/common.cuh: how our flash kernels are launched, for this run only (a caller's later launches, e.g. the
    // GPU tests after a --pdl off run, take the setting they had)
    struct PdlSetting {
        bool before;
        ~PdlSetting() { pdl_enabled() = before; }
    } pdl_setting{pdl_enabled()};
    pdl_enabled() = o.pdl;
    // 1. the model's config: resumed, random (dN) or from a file
    std::string resume_model;
    int64_t resume_step = -1;
    if (o.resume) {
        resume_step = latest_checkpoint_step(o.out_dir);
        if (resume_step < 0) fail("--resume: no complete checkpoint (a DONE_<step> file) in %s", o.out_dir.c_str());
        resume_model = checkpoint_path(o.out_dir, "model", resume_step);
        const int saved_world = checkpoint_world(o.out_dir, resume_step);
        if (saved_world != dist.world)
            fail("--resume: the checkpoint at step %lld in %s was written by %d GPU(s) (its optimizer state is sharded "
                 "per GPU); resume with --num-gpus %d (this run has %d)", (long long)resume_step, o.out_dir.c_str(),
                 saved_world, saved_world, dist.world);
    }
    ensure_gpu(dist.local_rank);
    dist.connect();
    const GPT2Config cfg = resolve_config(o, resume_model);
    check_seq_len(o, cfg);
    if (o.sample_every > 0 && o.gen_tokens > cfg.max_seq_len)
        fail("-g: %d tokens per sample exceed the model's max_seq_len %d", o.gen_tokens, cfg.max_seq_len);
    const int grad_accum = grad_accum_steps(o, dist.world);
    const int tokens_per_step = o.B * o.T * grad_accum * dist.world;  // global

    // 2. data (checked before the GPU memory is taken: a bad file costs nothing)
    DataLoader train_loader(o.train_glob, o.B, o.T, true, o.seed, cfg.vocab_size);
    std::optional<DataLoader> val_loader;
    if (o.val_every > 0) {
        const int Tv = val_seq_len(o.val_glob, o.T, cfg.vocab_size);
        const int Bv = choose_val_batch(o.val_glob, o.B, Tv, cfg.vocab_size, o.val_max_batches);
        val_loader.emplace(o.val_glob, Bv, Tv, false, 0, cfg.vocab_size);
    }
    std::optional<Tokenizer> tokenizer;
    if (o.sample_every > 0 && dist.is_main()) {
        tokenizer = Tokenizer::load(o.tokenizer);
        if ((int)tokenizer->vocab_size > cfg.vocab_size)
            fail("%s: %u tokens, more than the model's vocab %d: samples could not be printed (--tokenizer, or -s 0)",
                 o.tokenizer.c_str(), tokenizer->vocab_size, cfg.vocab_size);
    }
    // the output directory: a fresh run refuses another run's checkpoints (--overwrite deletes them), a resume
    // refuses other settings (llmc/run_record.h); rank 0 decides, every rank waits for it
    if (dist.is_main()) open_run_dir(o.out_dir, run_record(o, cfg, train_loader, tokens_per_step, dist.world), o.resume,
                                     o.overwrite);
    dist.barrier(nullptr);

    // 3. the model on the GPU
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dist.local_rank));
    GPT2Model model(cfg, o.kernels, o.B, o.T, dist.world, dist.rank, o.recompute == 1);
    Rng rng(o.seed + 1);  // sampling (a generator of its own: init and data order are llm.c's streams)
    int first_step = 0;
    TrainState resumed;
    if (o.resume) {
        load_model_file(resume_model, model, /*require_checksum=*/true);
        const std::string state_file = state_path(o.out_dir, resume_step, dist.rank, dist.world);
        resumed = load_state_file(state_file, model);
        const TrainState& st = resumed;
        if (st.B != o.B || st.T != o.T || st.total_batch != (int64_t)tokens_per_step)
            fail("--resume: the checkpoint was trained with -b %lld -t %lld -d %lld; resume with the same values "
                 "(got -b %d -t %d -d %d)", (long long)st.B, (long long)st.T, (long long)st.total_batch, o.B, o.T,
                 tokens_per_step);
        if (st.step >= o.steps)
            fail("--resume: the checkpoint is at step %lld and -x asks for %d steps: nothing to do (raise -x)",
                 (long long)st.step, o.steps);
        train_loader.restore(st.loader, state_file);
        if (train_loader.batches_read() != (uint64_t)st.step * grad_accum * dist.world)
            fail("%s: its data position (%llu batches read) is not where %lld steps of %d batches leave it",
                 state_file.c_str(), (unsigned long long)train_loader.batches_read(), (long long)st.step,
                 grad_accum * dist.world);
        rng.state = st.rng_state;
        first_step = (int)st.step;
    } else {
        model.set_params(initial_params(o, cfg));
    }
    const std::string matmul_line = setup_matmul_algos(o.matmul_algos, o.out_dir, o.resume, dist.world, [&] {
        const std::vector<int> zeros((size_t)o.B * o.T, 0);  // a batch of token 0, thrown away after
        model.forward(zeros.data(), zeros.data(), o.B, o.T, true, 1.0f / ((float)o.B * o.T));
        model.backward();
        cudaCheck(cudaStreamSynchronize(model.stream));
    });
    std::optional<Decoder> decoder;
    if (tokenizer) decoder.emplace(model, 1);
    Logger log(dist.is_main() ? (std::filesystem::path(o.out_dir) / "main.log").string() : "", o.resume);

    const double fpt = flops_per_token(cfg, o.T);
    const double peak = PEAK_FLOPS * dist.world;  // tok/s counts every GPU's tokens, so MFU is against all of them
    // the run's header: stdout and main.log say which kernels run, attention's engines per pass included
    const std::string kernels_line = std::string("kernels: ") + o.kernels.str() + "; attention: " +
                                     attention_kernels_str(model.ks, cfg.channels / cfg.num_heads) +
                                     "; matmul: " + matmul_kernels_str(model.ks, cfg.channels) +
                                     (pdl_enabled() && pdl_supported() ? "; launches: PDL" : "; launches: ordinary");
    char head[512];
    snprintf(head, sizeof head, "device: %s (%.1f GiB), precision %s, %s", prop.name, gib(prop.totalGlobalMem),
             PRECISION_NAME, kernels_line.c_str());
    log.log_comment(head);
    log.log_comment(matmul_line);
    log.log_comment("model: " + config_str(cfg) + ", batch B=" + std::to_string(o.B) + " T=" + std::to_string(o.T) +
                    ", " + std::to_string(tokens_per_step) + " tokens per step");
    if (!quiet) {
        printf("%s\n%s\n", head, matmul_line.c_str());
        if (dist.active())
            printf("data parallel: %d GPU(s), NCCL %s, ZeRO-1: %zu optimizer parameters per GPU\n", dist.world,
                   dist.world == 1 ? "1-rank communicator" : "reduce-scatter + all-gather", model.shard_size);
        printf("model: %s, %zu parameters, %.1f MFLOP per token; MFU against %s%s\n", config_str(cfg).c_str(),
               model.num_params, fpt / 1e6, PEAK_NAME, dist.world > 1 ? " per GPU" : "");
        printf("batch: B=%d T=%d, %d micro-batch(es) per step x %d GPU(s) = %d tokens; train: %zu batches per epoch",
               o.B, o.T, grad_accum, dist.world, tokens_per_step, train_loader.num_batches());
        if (val_loader)
            printf("; val: %zu batches of %dx%d = %zu tokens%s", val_loader->num_batches(), val_loader->B, val_loader->T,
                   val_loader->num_batches() * val_loader->B * val_loader->T,
                   val_loader->T < o.T ? " (the val split is shorter than one T+1 window: its longest window instead)" : "");
        printf("\n");
        print_memory_plan(stdout, model.plan);
        printf("log: %s (one line per step; checkpoints in %s)\n", log.path().c_str(), o.out_dir.c_str());
        if (o.resume) printf("resumed from %s at step %d\n", resume_model.c_str(), first_step);
        fflush(stdout);
    }

    // 4. the loop: at step s the model has had s updates; evaluate, sample, checkpoint, then train step s.
    TrainResult res;
    res.first_step = first_step;
    StepRunner runner(model, train_loader, grad_accum, dist, o.spike_z);
    if (o.resume) runner.guard.state = resumed.guard;
    double timed_ms = 0.0;
    int timed_steps = 0;
    LayerProfiler prof;  // --profile-steps N: the last N steps, by layer
    if (o.profile_steps > o.steps - first_step)
        fail("--profile-steps %d: this run has %d steps to go", o.profile_steps, o.steps - first_step);
    const int profile_from = o.steps - o.profile_steps;
    const auto t_start = std::chrono::steady_clock::now();  // elapsed and ETA on the step lines
    for (int step = first_step; step <= o.steps; step++) {
        const bool last = step == o.steps;
        // (a resumed run skips the sample at its first step: it was drawn before the checkpoint, RNG included)
        const bool sampled_before_checkpoint = o.resume && step == first_step;
        const bool evaluates = val_loader && (step % o.val_every == 0 || last);
        const bool samples = decoder && !sampled_before_checkpoint && ((step > 0 && step % o.sample_every == 0) || last);
        const bool periodic = o.checkpoint_every > 0 && step > first_step && step % o.checkpoint_every == 0;
        const bool checkpoints = periodic || (last && o.checkpoint_every >= 0 && step > first_step);
        if (evaluates || samples || checkpoints || last) runner.drain();  // they read the weights: the update first
        std::optional<float> val;
        if (evaluates) {
            val = fault_value("nan-val", step, evaluate(model, *val_loader, o.val_max_batches, dist));
            require_finite(step, "validation loss", *val);
            res.val_losses.push_back({step, *val});
            if (!quiet) printf("step %4d/%d | val loss %.6f\n", step, o.steps, *val);
        }
        if (samples) {
            const std::string text =
                generate_text(*decoder, *tokenizer, rng, {(int)tokenizer->eot_token}, o.gen_tokens, o.top_k, o.temperature);
            res.samples.push_back(text);
            if (!quiet) printf("sample at step %d:\n---\n%s\n---\n", step, text.c_str());
        }
        if (checkpoints) {
            TrainState st;
            st.step = step, st.rng_state = rng.state, st.B = o.B, st.T = o.T, st.total_batch = tokens_per_step;
            st.seed = o.seed, st.loader = runner.loader_state(), st.guard = runner.guard.state;
            save_checkpoint_cuda(o.out_dir, model, st, dist);
            if (!quiet) printf("checkpoint: %s\n", checkpoint_path(o.out_dir, "model", step).c_str());
        }
        if (last) {
            if (val) log.log_val(step, *val);
            break;
        }

        const bool profiled = step >= profile_from;
        model.prof = profiled ? &prof : nullptr;
        const StepResult r = runner.run(step, o);
        model.prof = nullptr;  // (evaluation and sampling are never profiled)
        if (profiled) prof.collect();
        const double tok_s = tokens_per_step / (r.ms / 1e3);
        res.train_losses.push_back(r.loss);
        res.peak_memory = std::max(res.peak_memory, gpu_memory_used());
        // the first step pays one-time setup, and profiled steps the events' idle time: neither is timed
        if ((step > first_step || o.steps - first_step == 1) && !profiled) {
            timed_ms += r.ms;
            timed_steps++;
        }
        char note[64] = "";
        if (r.spike.skip) snprintf(note, sizeof note, "skipped lossz %.2f", r.spike.z);
        log.log_step(step, r.loss, val, r.lr, r.norm, r.ms, tok_s, note);
        if (!quiet) {
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
            const double eta = elapsed / (step + 1 - first_step) * (o.steps - step - 1);  // at this run's pace so far
            printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.2f ms | %.1f%% MFU | %.0f tok/s | %s elapsed, "
                   "ETA %s%s\n", step + 1, o.steps, r.loss, r.norm, r.lr, r.ms, 100.0 * fpt * tok_s / peak, tok_s,
                   duration_str(elapsed).c_str(), duration_str(eta).c_str(),
                   r.spike.skip ? (" | update skipped: loss z-score " + std::to_string(r.spike.z)).c_str() : "");
        }
        fflush(stdout);
    }
    if (o.profile_steps > 0 && dist.is_main()) {
        SetProfile set;
        set.ks = model.ks;
        set.attention = attention_kernels_str(model.ks, cfg.channels / cfg.num_heads);
        for (int l = 0; l < NUM_LAYERS; l++) {
            set.fwd_ms[l] = prof.ms(layer_at(l), Pass::forward) / o.profile_steps;
            set.bwd_ms[l] = prof.ms(layer_at(l), Pass::backward) / o.profile_steps;
        }
        CompareRun run;
        run.card = prop.name, run.date = utc_timestamp(), run.precision = PRECISION_NAME, run.model = config_str(cfg);
        run.B = o.B, run.T = o.T, run.seed = o.seed, run.profiled_steps = o.profile_steps;
        const std::string md = profile_report_md(run, set);
        if (!quiet) fputs(md.c_str(), stdout);
        write_file_atomic((std::filesystem::path(o.out_dir) / "profile.md").string(), md);
    }
    res.allocated = model.mem.allocated;
    if (timed_steps > 0) {
        res.mean_ms = timed_ms / timed_steps;
        res.tok_per_s = tokens_per_step / (res.mean_ms / 1e3);
        res.mfu = fpt * res.tok_per_s / peak;
    }
    if (!quiet && timed_steps > 0)
        printf("summary: kernels %s B=%d T=%d | mean %.2f ms/step over %d steps (first step excluded) | %.0f tok/s | "
               "%.1f%% MFU | peak GPU memory %.2f GiB (device-wide; %.2f GiB allocated by the trainer)\n",
               o.kernels.str().c_str(), o.B, o.T, res.mean_ms, timed_steps, res.tok_per_s, 100.0 * res.mfu,
               gib(res.peak_memory), gib(res.allocated));
    return res;
}

// ---------------------------------------------------------------------------------------------------------
// --sample (make sample on a GPU machine): text from a checkpoint, no training. The prompt arrives as GPT-2 token
// ids (build/tokenizer encodes it: the trainer carries no BPE encoder); its text and N new tokens are printed.
// Same flags, the same Rng(--seed) and the same draw per token as the CPU tool (tools/sample.cpp).
inline void run_sample(const TrainOptions& o) {
    if (o.num_gpus > 0 || launched_by_launcher()) fail("--sample runs on one GPU: drop --num-gpus");
    if (config_from_depth(o.init)) fail("--sample: -e names a checkpoint to sample from, not a random init (%s)", o.init.c_str());
    ensure_gpu();
    const GPT2Config cfg = load_checkpoint_config(o.init);
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    std::vector<int> prompt;
    std::istringstream words(o.prompt_ids);  // whitespace-separated, as build/tokenizer encode writes them
    for (std::string w; words >> w;) prompt.push_back((int)args::parse_int("--prompt-ids", w, 0, cfg.vocab_size - 1));
    if (prompt.empty()) prompt.push_back((int)tok.eot_token);  // a new document
    GPT2Model model(cfg, o.kernels, 1, 1);
    load_model_file(o.init, model);
    Decoder dec(model, 1);
    Rng rng(o.seed);
    std::string text;
    for (int t : prompt) text += tok.decode(t);
    text += generate_text(dec, tok, rng, prompt, o.gen_tokens, o.top_k, o.temperature);
    fprintf(stderr, "sampled %d tokens from %s: top-k %d, temperature %g, seed %llu, kernels %s\n", o.gen_tokens,
            o.init.c_str(), o.top_k, o.temperature, o.seed, o.kernels.str().c_str());
    printf("%s\n", text.c_str());
}

// ---------------------------------------------------------------------------------------------------------
// --compare (make compare): the same short run twice, all-naive then all-flash kernels, same seed, same data.
// Per set: 1 warm-up step, COMPARE_TIMED unprofiled steps (step ms, tok/s), then COMPARE_PROFILED steps with
// a CUDA event pair around every op (per-layer ms; the events add a little idle time, so the step total
// comes from the unprofiled steps).

constexpr int COMPARE_TIMED = 3, COMPARE_PROFILED = 2;

inline SetProfile compare_one(const TrainOptions& o, const GPT2Config& cfg, const std::vector<float>& init,
                              Variant variant) {
    SetProfile r;
    r.ks = KernelSet::all(variant);
    r.attention = attention_kernels_str(r.ks, cfg.channels / cfg.num_heads);
    DataLoader loader(o.train_glob, o.B, o.T, true, o.seed, cfg.vocab_size);
    GPT2Model model(cfg, r.ks, o.B, o.T);
    model.set_params(init);
    r.planned = model.plan.total();
    const Distributed one_gpu;  // --compare runs on one GPU
    StepRunner runner(model, loader, 1, one_gpu);
    LayerProfiler prof;
    int step = 0;
    r.losses.push_back(runner.run(step++, o).loss);  // warm-up: cuBLAS heuristics, first-touch
    for (int i = 0; i < COMPARE_TIMED; i++) {
        const StepResult s = runner.run(step++, o);
        r.losses.push_back(s.loss);
        r.step_ms += s.ms / COMPARE_TIMED;
    }
    model.prof = &prof;
    for (int i = 0; i < COMPARE_PROFILED; i++) {
        r.losses.push_back(runner.run(step++, o).loss);
        prof.collect();
    }
    model.prof = nullptr;
    for (int l = 0; l < NUM_LAYERS; l++) {
        r.fwd_ms[l] = prof.ms(layer_at(l), Pass::forward) / COMPARE_PROFILED;
        r.bwd_ms[l] = prof.ms(layer_at(l), Pass::backward) / COMPARE_PROFILED;
    }
    r.tok_per_s = (double)o.B * o.T / (r.step_ms / 1e3);
    r.peak_memory = gpu_memory_used();
    return r;
}

inline void run_compare(TrainOptions o) {
    if (o.num_gpus > 0 || launched_by_launcher()) fail("--compare runs on one GPU: drop --num-gpus");
    ensure_gpu();
    if (!o.given.count("-b")) o.B = 4;  // small enough for the naive set's (L,B,NH,T,T) attention buffers
    if (!o.given.count("-t")) o.T = 1024;
    o.steps = 1 + COMPARE_TIMED + COMPARE_PROFILED;
    o.warmup = std::min(o.warmup, o.steps);
    const GPT2Config cfg = resolve_config(o, "");
    check_seq_len(o, cfg);
    const std::vector<float> init = initial_params(o, cfg);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("compare: %s, %s, B=%d T=%d, %s, seed %llu: 1 warm-up + %d timed + %d profiled steps per kernel set\n",
           prop.name, config_str(cfg).c_str(), o.B, o.T, PRECISION_NAME, o.seed, COMPARE_TIMED, COMPARE_PROFILED);
    fflush(stdout);
    const SetProfile naive = compare_one(o, cfg, init, Variant::naive);
    const SetProfile flash = compare_one(o, cfg, init, Variant::flash);
    CompareRun run;
    run.card = prop.name, run.date = utc_timestamp(), run.precision = PRECISION_NAME, run.model = config_str(cfg);
    run.B = o.B, run.T = o.T, run.seed = o.seed, run.timed_steps = COMPARE_TIMED, run.profiled_steps = COMPARE_PROFILED;
    const std::string md = compare_report_md(run, naive, flash);
    fputs(md.c_str(), stdout);
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    const std::string path = (std::filesystem::path(o.out_dir) / "compare.md").string();
    write_file_atomic(path, md);
    printf("written to %s\n", path.c_str());
}

}  // namespace flashgpt2

#ifndef TESTING
int main(int argc, char** argv) {
    return flashgpt2::run_main([&] {
        using namespace flashgpt2;
        const TrainOptions o = parse_args(argc, argv);
        if (o.help) {
            print_help(stdout);
            return 0;
        }
        if (o.list_kernels) {
            print_kernel_registry(stdout);
            return 0;
        }
        if (o.compare) {
            run_compare(o);
            return 0;
        }
        if (o.sample) {
            run_sample(o);
            return 0;
        }
        if (o.num_gpus > 1 && o.rank < 0 && !launched_by_launcher())
            return launch_ranks(argc, argv, o.num_gpus);  // start the N ranks, each runs train()
        train(o);
        return 0;
    });
}
#endif
