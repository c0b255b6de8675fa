// The per-layer GPU tests' shapes (test_layers.cu, test_matmul.cu), and the one workspace for either kernel set.
#pragma once
#include <algorithm>
#include <string>

#include "llmc/kernels.h"

namespace flashgpt2::gtest {

struct Shape {
    int B, T, C, NH, V, Vp;
};
// Nothing here is a multiple of a tile (32/64 rows, 256-channel layernorm sweeps, 8-wide vectors of V),
// then T = 1, then GPT-2 small's width, then more rows (5015) than the layernorm backward's grid has warps
// (at most LN_BWD_MAX_BLOCKS = 384 blocks x 8; 264 x 8 on a 132-SM card at C = 96), so that warps take a second
// and a third row: each of a warp's two row buffers is filled again while the other is read.
inline const Shape SHAPES[] = {{2, 37, 96, 3, 300, 320}, {3, 1, 64, 1, 50, 64}, {2, 70, 768, 12, 1000, 1024},
                               {5, 1003, 96, 3, 300, 320}};

inline std::string name_of(const Shape& s) {
    return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C);
}

inline const Variant VARIANTS[2] = {Variant::naive, Variant::flash};

// The one workspace, large enough for either set.
inline size_t ws_bytes(const Shape& s) {
    return std::max(workspace_bytes(KernelSet::all(Variant::naive), s.B, s.T, s.C, s.NH, s.Vp),
                    workspace_bytes(KernelSet::all(Variant::flash), s.B, s.T, s.C, s.NH, s.Vp));
}

}  // namespace flashgpt2::gtest
