# flashgpt2 — GPT-2 in plain CUDA C++, every layer written twice: naive and flash.
# `make help` lists the targets below: each has a "# name: what it does" line above it.
.DEFAULT_GOAL := help
SHELL := /bin/bash
.DELETE_ON_ERROR:

# ---------------------------------------------------------------------------------------------------------
# Toolchain and header-only dependencies. Debian's packages put them in /usr/include; on the GPU machine
# a staged copy is used instead (scripts/lent_gpu.sh sets these to .gpu-carry/include/...).
CXX         ?= g++
NVCC        ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
EIGEN_INC   ?= /usr/include/eigen3
DOCTEST_INC ?=                  # empty: doctest/doctest.h from the system include path
STB_INC     ?= /usr/include/stb

# GPU architecture: read from the card when there is one, else Hopper (sm_90). Override: make GPU_ARCH=80.
# sm_90 is built as sm_90a, the target that allows wgmma and setmaxnreg (see dev/attention/forward/7_*).
GPU_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | grep -E '^[0-9]+\.[0-9]+$$' | tr -d .)
ifeq ($(strip $(GPU_ARCH)),)
override GPU_ARCH := 90
endif
ifeq ($(GPU_ARCH),90)
ARCH_FLAGS := -gencode=arch=compute_90a,code=sm_90a
else
ARCH_FLAGS := -arch=sm_$(GPU_ARCH)
endif

# PRECISION=BF16 (default): bf16 activations/weights, fp32 master weights and optimizer state.
# PRECISION=FP32: everything fp32, the exactness reference. Both are always built; this picks `make train`'s.
PRECISION ?= BF16
ifeq ($(filter $(PRECISION),BF16 FP32),)
$(error PRECISION must be BF16 or FP32, not '$(PRECISION)')
endif
prec = $(shell echo $(PRECISION) | tr A-Z a-z)
PREC_FLAGS_bf16 := -DENABLE_BF16
PREC_FLAGS_fp32 := -DENABLE_FP32

CXXFLAGS  ?= -O3
# (an include dir that is the system's own, /usr/include, must not be passed: -isystem would reorder it)
INC_FLAGS := -isystem $(EIGEN_INC) $(if $(DOCTEST_INC),-isystem $(DOCTEST_INC)) -isystem $(STB_INC)
CXXFLAGS  += -std=c++17 -Wall -Wextra -fopenmp -I. $(INC_FLAGS)
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 $(ARCH_FLAGS) -lineinfo -I. $(INC_FLAGS) -Xcompiler -fopenmp
CUDA_LIBS := -lcublas -lcublasLt -lgomp


# Every object file gets a dependency file, so a header edit rebuilds what includes it.
build/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

# ---------------------------------------------------------------------------------------------------------
# Data: TinyShakespeare tokenized by our own GPT-2 BPE (llmc/bpe.h) into llm.c's .bin format.
# Sources: $(DATA_MIRROR), else ../shared/data, else data/raw (downloaded once by data/get_sources.sh).
# The outputs depend on the three sources and the tool, so `make data` does nothing when they are up to date.
# Where the outputs exist but no sources do (the GPU machine, where the outputs are carried in), they are used
# as they are: there is nothing to rebuild them from.
DATA_DIR      := data/tinyshakespeare
DATA_FILES    := $(DATA_DIR)/tiny_shakespeare_train.bin $(DATA_DIR)/tiny_shakespeare_val.bin data/gpt2_tokenizer.bin
DATA_SRC      := $(shell bash data/get_sources.sh dir)
DATA_SOURCES  := $(DATA_SRC)/tinyshakespeare/input.txt $(DATA_SRC)/gpt2/encoder.json $(DATA_SRC)/gpt2/vocab.bpe
DATA_CARRIED  := $(if $(wildcard $(DATA_SOURCES))$(filter-out $(wildcard $(DATA_FILES)),$(DATA_FILES)),,yes)

build/prepro_tinyshakespeare: build/data/prepro_tinyshakespeare.o
	$(CXX) $(CXXFLAGS) $^ -o $@ -lpcre2-8

ifneq ($(DATA_CARRIED),yes)
$(DATA_SOURCES):
	@bash data/get_sources.sh fetch $(DATA_SRC) $@

$(DATA_FILES) &: build/prepro_tinyshakespeare $(DATA_SOURCES)
	./build/prepro_tinyshakespeare $(DATA_SRC) $(DATA_DIR) data/gpt2_tokenizer.bin
endif

# Your own text: `make data TEXT=path [NAME=name] [VAL=0.1]` (a UTF-8 file or a folder of them) writes data/$(NAME)/
# with $(NAME)_val.bin and $(NAME)_train.bin (numbered shards when large) and data/gpt2_tokenizer.bin
# (data/prepro_text.cpp). NAME defaults to TEXT's file or folder name without its extension. TEXT and NAME reach the
# tool through the environment, so quotes and spaces in them need no escaping.
build/prepro_text: build/data/prepro_text.o
	$(CXX) $(CXXFLAGS) $^ -o $@ -lpcre2-8

ifdef TEXT
export TEXT NAME
VAL ?= 0.1
# data: tokenize TinyShakespeare into data/tinyshakespeare/*.bin and write data/gpt2_tokenizer.bin (skipped when up to date); TEXT=path tokenizes your own text into data/NAME/
data: build/prepro_text $(if $(DATA_CARRIED),,$(DATA_SRC)/gpt2/encoder.json $(DATA_SRC)/gpt2/vocab.bpe)
	@name=$${NAME:-$$(basename "$${TEXT%/}" | sed 's/\.[^.]*$$//; s/[^A-Za-z0-9._-]/_/g')}; \
	echo "./build/prepro_text --val $(VAL) --bpe $(DATA_SRC) --tokenizer-out data/gpt2_tokenizer.bin \"$$TEXT\" \"data/$$name\""; \
	./build/prepro_text --val $(VAL) --bpe $(DATA_SRC) --tokenizer-out data/gpt2_tokenizer.bin "$$TEXT" "data/$$name"
else
data: $(DATA_FILES)
endif

# ---------------------------------------------------------------------------------------------------------
# CPU: the test suite and the CPU trainer, both on the Eigen reference model (llmc/ref).
TEST_CPU_OBJ := $(patsubst %.cpp,build/%.o,$(wildcard test/cpu/*.cpp))
-include $(TEST_CPU_OBJ:.o=.d) build/train_gpt2.d build/data/prepro_tinyshakespeare.d build/data/prepro_text.d

build/test_cpu: $(TEST_CPU_OBJ)
	$(CXX) $(CXXFLAGS) $^ -o $@ -lpcre2-8

build/train_gpt2: build/train_gpt2.o
	$(CXX) $(CXXFLAGS) $^ -o $@

# The command-line tools (tools/*.cpp, one program each): build/tokenizer, build/sample, build/loss,
# build/plot_loss, build/export_hf, build/import_hf. doc/guide/after_the_first_run.md shows them at work.
TOOLS := $(patsubst tools/%.cpp,build/%,$(wildcard tools/*.cpp))
-include $(patsubst build/%,build/tools/%.d,$(TOOLS))

$(TOOLS): build/%: build/tools/%.o
	$(CXX) $(CXXFLAGS) $< -o $@ $(TOOL_LIBS)
build/tokenizer build/sample: TOOL_LIBS := -lpcre2-8  # GPT-2's split regex (llmc/bpe.h)

# tools: build the command-line tools (tokenizer, sample, loss, plot_loss, export_hf, import_hf)
tools: $(TOOLS) build/prepro_text

# Dependencies are checked before a build could fail deep in a header (scripts/deps.sh: installs what is missing
# with apt-get when run as root on Debian/Ubuntu, else names the one command that does). The data needs PCRE2
# only where it is made, and curl only where a source must be downloaded.
DEPS       := CXX='$(CXX)' EIGEN_INC='$(EIGEN_INC)' DOCTEST_INC='$(DOCTEST_INC)' STB_INC='$(STB_INC)' NVCC='$(NVCC)' bash scripts/deps.sh
DATA_NEEDS := $(if $(DATA_CARRIED),,pcre2) $(if $(filter-out $(wildcard $(DATA_SOURCES)),$(DATA_SOURCES)),curl)

# ---------------------------------------------------------------------------------------------------------
# Reliability (doc/reliability.md): the fuzzer, built with AddressSanitizer and UndefinedBehaviorSanitizer into
# objects of its own (build/asan), and the scripts that run the CPU trainer into bad input, NaNs, kills and a full
# disk. `make test` runs them after the unit tests.
FUZZ_FLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
              -Wall -Wextra -I. $(INC_FLAGS)
FUZZ_OBJ   := build/asan/test/reliability/fuzz_cpu.o build/asan/test/cpu/alloc_watch.o
-include $(FUZZ_OBJ:.o=.d)

build/asan/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@

build/fuzz_cpu: $(FUZZ_OBJ)
	$(CXX) $(FUZZ_FLAGS) $^ -o $@ -lpcre2-8

FUZZ_RUN := ./build/fuzz_cpu --text $(DATA_SRC)/tinyshakespeare/input.txt --encoder $(DATA_SRC)/gpt2/encoder.json \
            --merges $(DATA_SRC)/gpt2/vocab.bpe --tokenizer data/gpt2_tokenizer.bin

# test: check the dependencies, then the CPU test suite (doctest: tokenizer, data, reference model vs finite differences, checkpoints, tools, bad input), the fuzzer and the trainer's fault-injection scripts
test:
	@$(DEPS) cxx make eigen doctest stb pcre2 $(DATA_NEEDS)
	@$(MAKE) --no-print-directory build/test_cpu build/fuzz_cpu data tools build/train_gpt2
	./build/test_cpu
	$(FUZZ_RUN)
	bash test/reliability/trainer.sh
	bash test/reliability/fault.sh

# fuzz: seeded mutations of every file type through the real loaders under ASan/UBSan (FUZZ_ARGS="--cases N --seed S")
fuzz: build/fuzz_cpu data
	$(FUZZ_RUN) $(FUZZ_ARGS)

# fault: the CPU trainer killed at seeded points and on a full disk, resumed to the same bits (FAULT_SEED, FAULT_TRIALS)
fault: build/train_gpt2 data
	bash test/reliability/trainer.sh
	bash test/reliability/fault.sh

# reliability: run the fuzzer and the fault scripts and write their figures into doc/reliability.md
reliability: build/fuzz_cpu build/train_gpt2 data
	bash test/reliability/update_doc.sh "$(FUZZ_RUN)"

# plots: PNG loss curves (train and val) from training logs, overlaid and labelled (build/plot_loss): make plots LOGS="a/main.log b/main.log" [LABELS="naive,flash"] [OUT=doc/results/loss.png]
LOGS ?= $(wildcard log/main.log log/train_cpu.log)
plots: build/plot_loss
	@[ -n "$(strip $(LOGS))" ] || { echo "error: no logs to plot: train first (make train) or give LOGS=\"a/main.log b/main.log\"" >&2; exit 1; }
	./build/plot_loss -o '$(or $(OUT),doc/results/loss.png)' $(if $(LABELS),--labels '$(LABELS)') $(LOGS)

# export-hf: an llm.c checkpoint -> a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer files) that transformers' GPT2LMHeadModel.from_pretrained loads: make export-hf CKPT=checkpoints/cpu_model.bin OUT=hf/my-gpt2
export-hf: build/export_hf
	@[ -n "$(OUT)" ] || { echo "error: give OUT=dir, the folder to write (e.g. make export-hf CKPT=$(CKPT) OUT=hf/my-gpt2)" >&2; exit 1; }
	./build/export_hf $(if $(wildcard $(DATA_SRC)/gpt2/encoder.json),--bpe $(DATA_SRC)) '$(CKPT)' '$(OUT)'

# import-hf: a local Hugging Face GPT-2 folder (config.json + model.safetensors) -> an llm.c checkpoint both trainers start from (-e): make import-hf HF=path/to/gpt2 OUT=gpt2_124M.bin
import-hf: build/import_hf
	@[ -n "$(HF)" ] && [ -n "$(OUT)" ] || { echo "error: give HF=dir (a GPT-2 folder) and OUT=file.bin" >&2; exit 1; }
	./build/import_hf '$(HF)' '$(OUT)'

# ---------------------------------------------------------------------------------------------------------
# CUDA: the trainer, the GPU tests and the attention ladder. Built in both precisions. Every GPU target below runs
# on the machine it is typed on; scripts/lent_gpu.sh is only the wrapper for the project's lent, remote GPU.
LLMC_CUH := $(wildcard llmc/*.cuh llmc/*.h llmc/*/*.cuh llmc/*/*.h)
TEST_GPU_SRC := $(wildcard test/gpu/*.cu)

# NCCL, for multi-GPU data parallel training (llmc/distributed.h): the CUDA toolkit's, else the pip wheel's
# (nvidia-nccl-cu13, found through python3), else none: then the trainer is built without it (FLASHGPT2_NO_NCCL)
# and --num-gpus says so. Override: make NCCL_FLAGS=... NCCL_LIBS=...
# The toolkit's folder, as nvcc itself reports it (its --dryrun TOP line): the nvcc on PATH may be a wrapper
# script elsewhere (CI's /usr/local/bin/nvcc execs /usr/local/cuda-13.0/bin/nvcc).
NVCC_HOME := $(abspath $(or $(shell $(NVCC) --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#[$$] TOP=//p'),$(patsubst %/bin/nvcc,%/bin/..,$(NVCC))))
ifneq ($(wildcard $(NVCC_HOME)/include/nccl.h),)
NCCL_FLAGS ?=
NCCL_LIBS  ?= -lnccl
else
NCCL_PIP   := $(shell python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
ifneq ($(wildcard $(NCCL_PIP)/include/nccl.h),)
NCCL_FLAGS ?= -isystem $(NCCL_PIP)/include
NCCL_LIBS  ?= -L$(NCCL_PIP)/lib -l:libnccl.so.2 -Xlinker -rpath=$(NCCL_PIP)/lib
else
NCCL_FLAGS ?= -DFLASHGPT2_NO_NCCL
NCCL_LIBS  ?=
endif
endif
NVCCFLAGS += $(NCCL_FLAGS)
CUDA_LIBS += $(NCCL_LIBS)

build/train_gpt2cu_%: train_gpt2.cu $(LLMC_CUH)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(PREC_FLAGS_$*) $< -o $@ $(CUDA_LIBS)

# GPU tests: each test/gpu/*.cu is compiled once per precision into build/<prec>/test/gpu/*.o (with header
# dependencies from -MMD, so editing one test file recompiles only that file), then linked into
# build/test_gpu_<prec>. The oracle (Eigen) runs on the host only: EIGEN_NO_CUDA keeps Eigen from
# annotating itself __host__ __device__ when nvcc compiles it (which only produces warnings).
TEST_GPU_FLAGS    := -DEIGEN_NO_CUDA
TEST_GPU_OBJ_bf16 := $(patsubst %.cu,build/bf16/%.o,$(TEST_GPU_SRC))
TEST_GPU_OBJ_fp32 := $(patsubst %.cu,build/fp32/%.o,$(TEST_GPU_SRC))
-include $(TEST_GPU_OBJ_bf16:.o=.d) $(TEST_GPU_OBJ_fp32:.o=.d)

build/bf16/test/gpu/%.o: test/gpu/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(TEST_GPU_FLAGS) $(PREC_FLAGS_bf16) -MMD -MP -c $< -o $@

build/fp32/test/gpu/%.o: test/gpu/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(TEST_GPU_FLAGS) $(PREC_FLAGS_fp32) -MMD -MP -c $< -o $@

build/test_gpu_bf16: $(TEST_GPU_OBJ_bf16)
build/test_gpu_fp32: $(TEST_GPU_OBJ_fp32)
build/test_gpu_%:
	$(NVCC) $(NVCCFLAGS) $^ -o $@ $(CUDA_LIBS)

# The attention runner (dev/attention/runner is the script that builds it when needed and runs it).
build/attention_runner: dev/attention/runner.cu $(wildcard dev/*.cuh dev/*.h dev/attention/*.cuh dev/attention/*.h dev/attention/*/*.cuh) $(LLMC_CUH)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(CUDA_LIBS)

# The Hopper self-test checks rung 7's data path alone (TMA, swizzle, wgmma descriptors): run it when rung 7 fails.
build/hopper_ptx_selftest: dev/attention/forward/hopper_ptx_selftest.cu $(wildcard dev/attention/*.cuh dev/attention/forward/*.cuh) $(LLMC_CUH)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $< -o $@

# The memory wall: the card's HBM, L2, shared memory and compute measured, naive and flash attention on a roofline.
build/memory_wall: dev/memory_wall.cu $(wildcard dev/*.cuh dev/attention/*.cuh) $(LLMC_CUH)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(PREC_FLAGS_bf16) $< -o $@ $(CUDA_LIBS)

# The MLP's GELU matmuls: the wgmma engine beside cuBLASLt's fused and plain GEMMs, validated then timed.
build/matmul_gelu_bench: dev/matmul/gelu_bench.cu $(wildcard dev/*.cuh) $(LLMC_CUH)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(TEST_GPU_FLAGS) $(PREC_FLAGS_bf16) $< -o $@ $(CUDA_LIBS)

# The kernel trace: a CUDA injection library that writes when each kernel, memcpy and memset of any program ran
# (CUPTI's activity records), for scripts/step_gaps.py (make profile-step). CUPTI: the toolkit's own, else its
# extras/CUPTI folder.
CUPTI_HOME := $(firstword $(foreach d,$(NVCC_HOME) $(NVCC_HOME)/extras/CUPTI,$(if $(wildcard $(d)/include/cupti.h),$(d))))
CUPTI_LIB  := $(firstword $(foreach d,lib64 lib,$(if $(wildcard $(CUPTI_HOME)/$(d)/libcupti.so),$(CUPTI_HOME)/$(d))))
build/libkernel_trace.so: dev/kernel_trace.cpp
	@mkdir -p $(@D)
	@[[ -n "$(CUPTI_LIB)" ]] || { echo "no CUPTI (cupti.h and libcupti.so) under $(NVCC_HOME) or its extras/CUPTI"; exit 1; }
	$(CXX) -O2 -std=c++17 -Wall -Wextra -shared -fPIC -isystem $(CUPTI_HOME)/include -isystem $(NVCC_HOME)/include $< -o $@ \
	  -L$(CUPTI_LIB) -lcupti -Wl,-rpath,$(CUPTI_LIB)

CUDA_BINS := build/train_gpt2cu_bf16 build/train_gpt2cu_fp32 build/test_gpu_bf16 build/test_gpu_fp32 build/attention_runner build/hopper_ptx_selftest build/memory_wall build/matmul_gelu_bench build/libkernel_trace.so

# cuda: build every CUDA program in both precisions (CI runs this: a compile error fails it even without a GPU)
cuda: $(CUDA_BINS)

# test-gpu: run the GPU gradient tests, FP32 then BF16: every layer naive and flash vs the reference, then the whole model
test-gpu: build/test_gpu_fp32 build/test_gpu_bf16 build/train_gpt2cu_bf16 data
	./build/test_gpu_fp32
	./build/test_gpu_bf16
	bash test/gpu/divergence.sh

# dev-attention: build the attention ladder runner (./dev/attention/runner --list needs no GPU; ./dev/attention/runner fwd V [B H T D] does)
dev-attention: build/attention_runner

# bench-attention: both attention ladders, forward then backward, every rung validated then timed on the anchor shapes beside PyTorch's FA2 and cuDNN (scripts/torch/sdpa_bench.py in the same run, when PyTorch is installed); writes doc/results/attention_{forward,backward}.{csv,md,png}, the README tables and each rung page's "Measured" block
bench-attention: build/attention_runner
	OUT=log/bench-attention bash scripts/bench/20_attention_forward.sh
	ANCHORS=log/bench-attention/sdpa.log SKIP_SANITIZER=1 OUT=log/bench-attention/backward bash scripts/bench/22_attention_backward.sh

# bench-matmul: the MLP's two GELU matmuls (fc forward, fcproj's dinp) on the wgmma engine against cuBLASLt's fused epilogues and its plain GEMM, GPT-2 d12/d24/d48 shapes, each validated first; writes doc/results/matmul_gelu.md
bench-matmul: build/matmul_gelu_bench
	./build/matmul_gelu_bench --out doc/results/matmul_gelu.md

# bench-attention-bwd: the backward ladder alone: odd-T validation of every rung, the bench on the anchor shapes beside cuDNN/FA2, compute-sanitizer on a small shape; writes doc/results/attention_backward.{csv,md,png}, the README table and the backward rung pages' "Measured" blocks
bench-attention-bwd: build/attention_runner
	OUT=log/bench-attention-bwd bash scripts/bench/22_attention_backward.sh

# schedule-model: no GPU: the attention backward's grid orders (rungs 5, 9 and rung 6's persistent grid) in a model of the block dispatcher; writes doc/results/schedule_model{,_persistent}.md and their blocks in the pages of backward rungs 9 and 6
schedule-model: build/attention_runner
	./dev/attention/runner schedule --out doc/results
	bash scripts/readme_table.sh doc/results/schedule_model.md schedule-model doc/attention/backward/9_heaviest_first.md
	bash scripts/readme_table.sh doc/results/schedule_model_persistent.md schedule-model doc/attention/backward/6_warp_specialized.md
.PHONY: schedule-model

# memory-wall: measure this card's memory hierarchy (HBM, L2, shared memory, tensor-core and fp32 peaks) and place naive and flash attention on its roofline, bytes from Nsight Compute when ncu is installed; writes doc/results/memory_wall.{md,csv} and the block in doc/memory_wall.md
memory-wall: build/memory_wall
	OUT=log/memory-wall bash scripts/bench/71_memory_wall.sh
.PHONY: memory-wall

# ---------------------------------------------------------------------------------------------------------
# The CUDA trainer's TinyShakespeare run: GPT-2 124M from scratch with recipe R1 (its defaults: B=16 T=1024, lr 6e-4,
# 20 warm-up steps, cosine to 10%, wd 0.1, clip 1.0, 250 steps, val every 10), log and final checkpoint in log/.
# TRAIN_ARGS adds or overrides flags (e.g. TRAIN_ARGS="-b 8 --attention naive"); ./build/train_gpt2cu_bf16 --help lists them.
# DATA=data/<name> trains on a dataset that `make data TEXT=...` wrote (its <name>_val.bin and <name>_train*.bin),
# with either trainer; without it, on TinyShakespeare.
ifdef DATA
DATA_NAME       := $(patsubst %_val.bin,%,$(notdir $(wildcard $(DATA)/*_val.bin)))
TRAIN_DATA_ARGS := -i '$(DATA)/$(DATA_NAME)_train*.bin' -j '$(DATA)/$(DATA_NAME)_val.bin'
TRAIN_DATA_GOAL := data/gpt2_tokenizer.bin
TRAIN_DATA_CHECK = [ $(words $(DATA_NAME)) = 1 ] || { echo "error: DATA=$(DATA): no single <name>_val.bin there (make data TEXT=... writes a dataset folder)" >&2; exit 1; }
else
TRAIN_DATA_ARGS := -i $(DATA_DIR)/tiny_shakespeare_train.bin -j $(DATA_DIR)/tiny_shakespeare_val.bin
TRAIN_DATA_GOAL := data
TRAIN_DATA_CHECK = true
endif
TRAIN_GPU_ARGS ?= $(TRAIN_DATA_ARGS) --tokenizer data/gpt2_tokenizer.bin -e d12 -o log

# train: train GPT-2 on TinyShakespeare (or DATA=data/<name>): the CUDA trainer when a GPU is present (GPT-2 124M, recipe R1), else the tiny CPU model
train:
	@$(TRAIN_DATA_CHECK)
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  $(DEPS) cxx make nvcc cublas eigen $(DATA_NEEDS) && \
	  $(MAKE) --no-print-directory $(TRAIN_DATA_GOAL) build/train_gpt2cu_$(prec) && ./build/train_gpt2cu_$(prec) $(TRAIN_GPU_ARGS) $(TRAIN_ARGS); \
	else \
	  $(DEPS) cxx make eigen $(DATA_NEEDS) && \
	  echo "no CUDA GPU found: training the tiny CPU model instead (train_gpt2.cpp)" && \
	  $(MAKE) --no-print-directory $(TRAIN_DATA_GOAL) build/train_gpt2 && ./build/train_gpt2 $(TRAIN_DATA_ARGS) $(TRAIN_ARGS); \
	fi

# sample: text from a checkpoint, no training: the GPU trainer's KV cache when a GPU is present, else the Eigen model (build/sample): make sample CKPT=log/model_00000250.bin PROMPT="ROMEO:" [SAMPLE_ARGS="-g 100 --top-k 40 --temperature 0.8 --seed 1"]
CKPT ?= checkpoints/cpu_model.bin
export PROMPT
sample: build/sample build/tokenizer data/gpt2_tokenizer.bin $(if $(PROMPT),$(if $(DATA_CARRIED),,$(DATA_SRC)/gpt2/encoder.json $(DATA_SRC)/gpt2/vocab.bpe))
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory build/train_gpt2cu_$(prec) && \
	  ids=$$(printf '%s' "$$PROMPT" | ./build/tokenizer encode --allow-special --bpe $(DATA_SRC)) && \
	  ./build/train_gpt2cu_$(prec) --sample -e '$(CKPT)' --prompt-ids "$$ids" --tokenizer data/gpt2_tokenizer.bin $(SAMPLE_ARGS); \
	else \
	  ./build/sample --model '$(CKPT)' --prompt "$$PROMPT" --bpe $(DATA_SRC) $(SAMPLE_ARGS); \
	fi

# compare: short training runs with the naive kernels, then the flash ones (d12, B=4 T=1024); prints per-layer ms and memory side by side, writes doc/results/compare.md and the README table
compare: build/train_gpt2cu_$(prec) data
	./build/train_gpt2cu_$(prec) --compare -i $(DATA_DIR)/tiny_shakespeare_train.bin -o log $(COMPARE_ARGS)
	cp log/compare.md doc/results/compare.md
	bash scripts/readme_table.sh doc/results/compare.md compare

# bench-train: the training acceptance runs (R1, naive vs flash in B=4 micro-batches, throughput at B=16/64 beside PyTorch when it is installed); writes doc/results/training.md and the README table (~8 min on an H200); PARTS=acceptance or PARTS=speed runs one half (R1 and naive vs flash; or the timings with PyTorch's), each under 10 min, and the table is written once log/bench-train has both
bench-train: build/train_gpt2cu_bf16 build/train_gpt2cu_fp32 data
	OUT=log/bench-train bash scripts/bench/40_train.sh

# r1-spread: recipe R1 over several seeds, ours in BF16 and FP32 and PyTorch's (scripts/torch/r1.py); writes doc/results/r1_spread.md and the README table (~6 min on an H200)
r1-spread: build/train_gpt2cu_bf16 build/train_gpt2cu_fp32 data
	OUT=log/r1-spread bash scripts/bench/41_r1_spread.sh

# nf-layers: where the BF16 naive and flash trajectories part: one layer naive at a time against all-flash, B=4, 20 steps; writes doc/results/naive_vs_flash.md and the README table (~2 min on an H200)
nf-layers: build/train_gpt2cu_bf16 data
	OUT=log/nf-layers bash scripts/bench/42_nf_layers.sh

# profile-step: one B=16 training step under Nsight Compute (ncu), kernel by kernel and its SM clock, against the wall-clock step, then the same step's timeline (build/libkernel_trace.so: how long the GPU idles between kernels, and after which); writes doc/results/step_profile.md (~50 s on an H200)
profile-step: build/train_gpt2cu_bf16 build/libkernel_trace.so data
	OUT=log/profile-step bash scripts/bench/45_profile_step.sh

# long-context: d12 at 32,768 tokens per step for T = 1K..32K: the flash set, the naive-attention set (refused before allocation where it cannot fit) and PyTorch in the same run; writes doc/results/long_context.md and the README table (~6 min on an H200 with PyTorch)
long-context: build/train_gpt2cu_bf16 data
	OUT=log/long-context bash scripts/bench/70_long_context.sh

# long-context-curve: d12 from random weights, 16,384 tokens per step, 300 steps at T=1024 (B=16) and T=8192 (B=2), val every 25: the two val curves (doc/results/long_context_curve.{md,png}), spliced into doc/long_context.md (~1 min on an H200)
long-context-curve: build/train_gpt2cu_bf16 build/plot_loss data
	OUT=log/long-context-curve bash scripts/bench/71_long_context_curve.sh

# distributed: data parallel checks: --num-gpus 1 (NCCL) gives the plain trainer's bits; with 2+ GPUs, R1 on 2 GPUs against 1 and the throughput ratio; writes doc/results/distributed.md and the README table (~2 min on 2 H200s)
distributed: build/train_gpt2cu_bf16 build/test_gpu_fp32 build/test_gpu_bf16 data
	OUT=log/distributed bash scripts/bench/60_distributed.sh

# all: data, every CPU program and tool, the fuzzer, every CUDA program
all: data build/test_cpu build/train_gpt2 tools build/fuzz_cpu cuda

# clean: remove build outputs (keeps data/ and checkpoints)
clean:
	rm -rf build

# help: list the targets
help:
	@grep -E '^# [a-z0-9-]+: ' Makefile | sed 's/^# /  make /'

.PHONY: data tools sample plots export-hf import-hf test fuzz fault reliability cuda test-gpu dev-attention bench-attention bench-matmul bench-attention-bwd train compare bench-train r1-spread nf-layers profile-step long-context long-context-curve distributed all clean help
