// The CUDA trainer's command line: every flag, its default, its check, and --help.
//
// Flags follow llm.c's train_gpt2.cu where it has one (-i -j -e -b -t -d -x -l -u -q -c -v -m -s -g -n -o)
// and are long words otherwise. Every value is parsed strictly ("-b 4x" is an error, not 4) and range-checked
// here; checks that need the model (T <= max_seq_len, ...) happen once the model's shape is known.
// Bad input throws flashgpt2::Error with the flag's name, so main() prints one line and exits 1.
// The defaults are recipe R1 (README / shared anchors): GPT-2 124M from scratch on TinyShakespeare.
#pragma once
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "llmc/error.h"
#include "llmc/kernels.h"
#include "llmc/args.h"

namespace flashgpt2 {

struct TrainOptions {
    std::string train_glob = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_glob = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer = "data/gpt2_tokenizer.bin";
    std::string init = "d12";      // dN (random init, depth N) or a checkpoint file
    int max_seq_len = 0;           // position table rows (wpe); 0 = the preset's 1024, or the checkpoint's
    int B = 16;                    // sequences per micro-batch
    int T = 1024;                  // tokens per sequence
    long total_batch = -1;         // tokens per optimizer step; -1 = B*T (no gradient accumulation)
    int recompute = 0;             // 1: the backward recomputes GELU's output instead of keeping it per layer (llm.c -r)
    int steps = 250;               // optimizer steps
    float lr = 6e-4f;              // peak learning rate
    int warmup = 20;               // linear warm-up steps
    float final_lr_frac = 0.1f;    // cosine decays to final_lr_frac * lr
    float weight_decay = 0.1f;     // AdamW decoupled weight decay (2-D weights only)
    float grad_clip = 1.0f;        // clip the global gradient norm to this; 0 = no clipping
    int val_every = 10;            // val loss every N steps (and at the last); 0 = never
    int val_max_batches = -1;      // -1 = the whole val split
    int sample_every = 50;         // generate text every N steps (and at the end); 0 = never
    int gen_tokens = 64;           // tokens per sample
    int top_k = 40;                // sample among the k most likely tokens; 0 = all
    float temperature = 1.0f;      // softmax temperature for sampling; 0 = greedy
    int checkpoint_every = 0;      // checkpoint every N steps; 0 = only at the end; -1 = never
    std::string out_dir = "log";   // checkpoints and the log file go here
    bool resume = false;           // continue from the newest complete checkpoint in out_dir
    bool overwrite = false;        // a fresh run may delete the checkpoints another run left in out_dir
    float spike_z = 0.0f;          // skip an update whose loss z-score exceeds this (llmc/guard.h); 0 = never
    unsigned long long seed = 42;  // model init and data order (as llm.c draws them), sampling
    KernelSet kernels = KernelSet::all(Variant::flash);
    std::string matmul_algos = "heuristic";  // heuristic | tune | a table file (llmc/matmul.cuh)
    bool pdl = true;               // our kernels start with programmatic dependent launch (llmc/common.cuh)
    bool list_kernels = false;
    bool compare = false;          // the `make compare` run: naive then flash, per-layer table
    bool sample = false;           // text from the -e checkpoint, no training (make sample)
    std::string prompt_ids;        // --sample's prompt as GPT-2 token ids ('' : <|endoftext|>)
    int profile_steps = 0;         // time every op of the last N steps by layer: DIR/profile.md
    bool help = false;
    bool quiet = false;            // no per-step stdout lines (tests)
    int num_gpus = 0;              // data parallel over N processes (llmc/distributed.h); 0 = the plain 1-GPU trainer
    int rank = -1;                 // this process's rank (-1: from the launcher's variables, or start the ranks)
    std::string init_file;         // where rank 0 leaves NCCL's id for the others
    std::set<std::string> given;   // the flags given on the command line (--compare keeps its own defaults otherwise)
};

inline void print_help(FILE* f) {
    const TrainOptions d;
    fprintf(f,
            "usage: train_gpt2cu [flags]   (build precision: %s)\n"
            "GPT-2 training on the GPU; every layer has a naive and a flash kernel (see --list-kernels).\n"
            "data and model:\n"
            "  -i GLOB        training token shards                      [%s]\n"
            "  -j GLOB        validation token shards                    [%s]\n"
            "  --tokenizer F  tokenizer for printing samples             [%s]\n"
            "  -e INIT        dN = random init of depth N (d2 d4 d6 d8 d10 d12 d24 d36 d48), or a checkpoint file [%s]\n"
            "  --max-seq-len N  position table rows: a random init gets N (GPT-2: 1024); a checkpoint's shorter table is\n"
            "                 extended (new rows drawn as GPT-2's init draws them). -t may be up to N\n"
            "  -b B           sequences per micro-batch                  [%d]\n"
            "  -t T           sequence length                            [%d]\n"
            "  -d TOKENS      total batch in tokens per step (gradient accumulation over TOKENS/(B*T) micro-batches;\n"
            "                 -1 = B*T)                                  [%ld]\n"
            "  -r 0|1         1: keep GELU's input only and recompute its output in the backward, one layer at a time\n"
            "                 (as llm.c's -r 1): (L-1)*B*T*4C fewer activations, one more GELU pass per layer [%d]\n"
            "optimization (AdamW, beta1 0.9, beta2 0.95, eps 1e-8):\n"
            "  -x STEPS       optimizer steps                            [%d]\n"
            "  -l LR          peak learning rate                         [%g]\n"
            "  -u STEPS       linear warm-up steps                       [%d]\n"
            "  -q FRAC        cosine decays to FRAC * LR at the last step [%g]\n"
            "  -c WD          weight decay                               [%g]\n"
            "  --grad-clip G  clip the global grad norm to G (0 = off)   [%g]\n"
            "  (a NaN or infinite loss, gradient norm or val loss stops the run before the update; exit 1)\n"
            "evaluation, sampling, checkpoints:\n"
            "  -v N           val loss every N steps (0 = never)         [%d]\n"
            "  -m N           val batches of B sequences per evaluation, as llm.c (-1 = the whole val split) [%d]\n"
            "  -s N           print a sample every N steps (0 = never)   [%d]\n"
            "  -g N           tokens per sample                          [%d]\n"
            "  --top-k K      sample among the K most likely (0 = all)   [%d]\n"
            "  --temperature X  sampling temperature (0 = greedy)        [%g]\n"
            "  -n N           checkpoint every N steps (0 = only at the end, -1 = never) [%d]\n"
            "  -o DIR         output directory: checkpoints, main.log    [%s]\n"
            "  --resume       continue bit-exactly from the newest complete checkpoint in DIR (every setting must match\n"
            "                 the run's DIR/run_settings.txt; what differs is listed)\n"
            "  --overwrite    a fresh run in a DIR that holds another run's checkpoints deletes them (else refused)\n"
            "  --spike-z Z    skip the update of a step whose loss z-score over the last 64 steps exceeds Z, and say\n"
            "                 so on the step line and in main.log (llm.c's outlier detector; 0 = never) [%g]\n"
            "  --seed S       init, data order (llm.c's for the same S), sampling [%llu]\n"
            "multi-GPU (data parallel, NCCL; ZeRO-1 optimizer shards; rank 0 writes logs and the model file):\n"
            "  --num-gpus N   N processes, one per GPU; -b is per GPU, -d the global batch (default N*B*T). Without\n"
            "                 --rank the trainer starts the N processes itself. N = 1: the NCCL path on one GPU\n"
            "  --rank R       this process's rank (by hand; mpirun/torchrun set OMPI_COMM_WORLD_RANK or RANK instead)\n"
            "  --init-file F  a file every rank can read: rank 0 writes NCCL's id there (needed with N > 1 and --rank)\n"
            "kernels:\n"
            "  --kernels naive|flash   the whole set                     [flash]\n"
            "  --encoder --layernorm --matmul --attention --gelu --residual --classifier --adamw naive|flash\n"
            "                 override one layer (after --kernels, e.g. --kernels flash --attention naive)\n"
            "  --attention flash:wgmma|flash:mma|flash:fp32\n"
            "                 the flash attention's engine (plain flash: the best one this card and head size run;\n"
            "                 the step header names the engines that ran; one that cannot run is an error)\n"
            "  --matmul flash:wgmma|flash:cublaslt\n"
            "                 the engine of the two matmuls that carry GELU (plain flash: wgmma on Hopper in BF16\n"
            "                 builds, else cuBLASLt; every other matmul is cuBLASLt's)\n"
            "  --matmul-algos heuristic|tune|FILE  which cuBLASLt algorithm each matmul takes: the heuristic's first;\n"
            "                 tune: the fastest of its first 8, timed once before step 1 and saved to DIR/matmul_algos.txt\n"
            "                 (a resume reads it back); FILE: such a table (the same algorithms: the same bits) [heuristic]\n"
            "  --pdl on|off   our flash kernels may start while the kernel before them finishes (programmatic\n"
            "                 dependent launch, sm_90 on; the same bits either way)                        [on]\n"
            "  --list-kernels print each layer's naive and flash kernel and exit\n"
            "  --profile-steps N  time every op of the last N steps by layer (CUDA events): a table on stdout and in\n"
            "                 DIR/profile.md (those steps are left out of the mean step time)\n"
            "  --sample       no training: print the --prompt-ids text and -g tokens sampled from the -e checkpoint\n"
            "                 (KV cache; --top-k, --temperature, --seed as below; `make sample` encodes a text prompt)\n"
            "  --prompt-ids IDS  the prompt as GPT-2 token ids (build/tokenizer encode writes them); '' = <|endoftext|>\n"
            "  --compare      time every layer with the naive set, then the flash set (same seed, same data),\n"
            "                 print the table and write it to DIR/compare.md (what `make compare` runs)\n"
            "  --quiet        no step lines on stdout (main.log keeps them)\n"
            "  -h, --help     this text\n",
            PRECISION_NAME, d.train_glob.c_str(), d.val_glob.c_str(), d.tokenizer.c_str(), d.init.c_str(), d.B, d.T,
            d.total_batch, d.recompute, d.steps, d.lr, d.warmup, d.final_lr_frac, d.weight_decay, d.grad_clip, d.val_every,
            d.val_max_batches, d.sample_every, d.gen_tokens, d.top_k, d.temperature, d.checkpoint_every,
            d.out_dir.c_str(), d.spike_z, d.seed);
}

inline bool is_layer_flag(const std::string& name) {
    for (const char* layer : LAYER_NAMES)
        if (name == layer) return true;
    return false;
}

inline TrainOptions parse_args(int argc, char** argv) {
    TrainOptions o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        // every flag once: a second one would silently override the first
        if (a.size() > 1 && a[0] == '-' && !o.given.insert(a).second) fail("%s: given twice", a.c_str());
        // flags without a value
        if (a == "-h" || a == "--help") { o.help = true; continue; }
        if (a == "--resume") { o.resume = true; continue; }
        if (a == "--overwrite") { o.overwrite = true; continue; }
        if (a == "--list-kernels") { o.list_kernels = true; continue; }
        if (a == "--compare") { o.compare = true; continue; }
        if (a == "--sample") { o.sample = true; continue; }
        if (a == "--quiet") { o.quiet = true; continue; }
        // flags with a value
        if (a.empty() || a[0] != '-') fail("unexpected argument '%s' (flags start with '-'; see --help)", a.c_str());
        if (i + 1 >= argc) fail("%s: missing value (see --help)", a.c_str());
        const char* f = a.c_str();
        const char* v = argv[++i];
        // a value never starts like a flag ("-o --resume" is a missing -o value), though a number may be negative
        if (v[0] == '-' && !(std::isdigit((unsigned char)v[1]) || v[1] == '.'))
            fail("%s: missing value (the next word, '%s', is a flag; see --help)", f, v);
        const int BIG = 1 << 30;
        if (a == "-i") o.train_glob = v;
        else if (a == "-j") o.val_glob = v;
        else if (a == "--tokenizer") o.tokenizer = v;
        else if (a == "-e") o.init = v;
        else if (a == "--max-seq-len") o.max_seq_len = (int)args::parse_int(f, v, 1, 1 << 20);
        else if (a == "-b") o.B = (int)args::parse_int(f, v, 1, BIG);
        else if (a == "-t") o.T = (int)args::parse_int(f, v, 1, BIG);
        else if (a == "-d") {
            o.total_batch = args::parse_int(f, v, -1, INT_MAX);
            if (o.total_batch != -1 && o.total_batch < 1) fail("-d: %ld must be -1 or a positive token count", o.total_batch);
        }
        else if (a == "-r") o.recompute = (int)args::parse_int(f, v, 0, 1);
        else if (a == "-x") o.steps = (int)args::parse_int(f, v, 1, BIG);
        else if (a == "-l") o.lr = (float)args::parse_float(f, v, 0.0, 10.0);
        else if (a == "-u") o.warmup = (int)args::parse_int(f, v, 0, BIG);
        else if (a == "-q") o.final_lr_frac = (float)args::parse_float(f, v, 0.0, 1.0);
        else if (a == "-c") o.weight_decay = (float)args::parse_float(f, v, 0.0, 10.0);
        else if (a == "--grad-clip") o.grad_clip = (float)args::parse_float(f, v, 0.0, 1e30);
        else if (a == "--spike-z") o.spike_z = (float)args::parse_float(f, v, 0.0, 1e30);
        else if (a == "-v") o.val_every = (int)args::parse_int(f, v, 0, BIG);
        else if (a == "-m") {
            o.val_max_batches = (int)args::parse_int(f, v, -1, BIG);
            if (o.val_max_batches == 0) fail("-m: 0 val batches; use -v 0 to switch evaluation off");
        }
        else if (a == "-s") o.sample_every = (int)args::parse_int(f, v, 0, BIG);
        else if (a == "-g") o.gen_tokens = (int)args::parse_int(f, v, 1, BIG);
        else if (a == "--top-k") o.top_k = (int)args::parse_int(f, v, 0, BIG);
        else if (a == "--temperature") o.temperature = (float)args::parse_float(f, v, 0.0, 100.0);
        else if (a == "-n") o.checkpoint_every = (int)args::parse_int(f, v, -1, BIG);
        else if (a == "-o") o.out_dir = v;
        else if (a == "--seed") o.seed = (unsigned long long)args::parse_int(f, v, 0, UINT32_MAX);  // llm.c's 32-bit streams
        else if (a == "--prompt-ids") o.prompt_ids = v;
        else if (a == "--profile-steps") o.profile_steps = (int)args::parse_int(f, v, 1, BIG);
        else if (a == "--num-gpus") o.num_gpus = (int)args::parse_int(f, v, 1, 1024);
        else if (a == "--rank") o.rank = (int)args::parse_int(f, v, 0, 1023);
        else if (a == "--init-file") o.init_file = v;
        else if (a == "--matmul-algos") o.matmul_algos = v;
        else if (a == "--pdl") {
            if (v != std::string("on") && v != std::string("off")) fail("--pdl %s: on or off", v);
            o.pdl = v == std::string("on");
        }
        else if (a == "--kernels") o.kernels = KernelSet::all(parse_variant(v, "--kernels"));
        else if (a.size() > 2 && a[1] == '-' && is_layer_flag(a.substr(2))) o.kernels.set(a.substr(2), v);
        else fail("unknown flag '%s' (see --help)", f);
    }
    if (o.out_dir.empty()) fail("-o: empty output directory");
    if (o.num_gpus == 0 && (o.given.count("--rank") || o.given.count("--init-file")))
        fail("%s: only with --num-gpus N (data parallel); alone it would be ignored",
             o.given.count("--rank") ? "--rank" : "--init-file");
    if ((long long)o.B * o.T > INT_MAX) fail("-b/-t: B*T = %lld positions; at most 2^31 - 1", (long long)o.B * o.T);
    return o;
}

}  // namespace flashgpt2
