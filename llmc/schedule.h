// The learning-rate schedule shared by the CPU and CUDA trainers: linear warm-up, then a cosine decay
// to a floor, as llm.c's "cosine" scheduler (and nanoGPT's get_lr):
//   step < warmup:  lr = max_lr * (step + 1) / warmup
//   after:          r = (step - warmup) / (total - warmup),  lr = min + 0.5 (1 + cos(pi r)) (max_lr - min),
//                   min = final_frac * max_lr;  r is clamped to [0, 1], so steps past total stay at min.
#pragma once
#include <algorithm>
#include <cmath>

namespace flashgpt2 {

inline float lr_cosine(int step, int total_steps, float max_lr, int warmup_steps, float final_frac) {
    if (step < warmup_steps) return max_lr * (float)(step + 1) / (float)warmup_steps;
    const float min_lr = final_frac * max_lr;
    if (total_steps <= warmup_steps) return min_lr;  // no room to decay: go straight to the floor
    float r = (float)(step - warmup_steps) / (float)(total_steps - warmup_steps);
    r = std::min(std::max(r, 0.0f), 1.0f);
    return min_lr + 0.5f * (1.0f + std::cos((float)M_PI * r)) * (max_lr - min_lr);
}

}  // namespace flashgpt2
