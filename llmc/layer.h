// The layer registry's one list: the eight layers of GPT-2 that this project writes twice (a naive and a flash
// kernel each, doc/design.md's layer table), their names, and the two passes a layer's time is charged to.
// Everything that enumerates layers (the kernel set, --<layer> flags, --list-kernels, the profiler, the
// --compare table) iterates over this enum and its name table.
#pragma once
#include <array>
#include <string>

namespace flashgpt2 {

enum class Layer { encoder, layernorm, matmul, attention, gelu, residual, classifier, adamw, count };
constexpr int NUM_LAYERS = static_cast<int>(Layer::count);
constexpr std::array<const char*, NUM_LAYERS> LAYER_NAMES = {
    "encoder", "layernorm", "matmul", "attention", "gelu", "residual", "classifier", "adamw"};

inline const char* layer_name(Layer l) { return LAYER_NAMES[static_cast<int>(l)]; }
inline constexpr Layer layer_at(int i) { return static_cast<Layer>(i); }

// The two versions of every layer: intermediates in HBM (naive), or tiled and fused on chip (flash).
enum class Variant { naive, flash };
inline const char* variant_name(Variant v) { return v == Variant::naive ? "naive" : "flash"; }

enum class Pass { forward, backward };
inline const char* pass_name(Pass p) { return p == Pass::forward ? "forward" : "backward"; }

}  // namespace flashgpt2
