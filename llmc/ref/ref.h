// The Eigen CPU reference of GPT-2 (the oracle), in one include: every layer forward and backward
// (layers.h, attention.h), the whole model (gpt2.h) and the optimizer (adamw.h). Namespace flashgpt2::ref.
// doc/reference.md describes it; test/cpu/test_ref_*.cpp check it against finite differences.
#pragma once
#include "llmc/ref/adamw.h"
#include "llmc/ref/attention.h"
#include "llmc/ref/gpt2.h"
#include "llmc/ref/layers.h"
