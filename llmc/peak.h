// The ceilings every "% of peak" and MFU figure of the project is measured against, in one place: the trainer's
// MFU, the attention runner's tables, the benchmark scripts (which read them from here).
//   bf16: dense bf16 matrix products through cuBLAS on the H200 (8192^3, random data), the tensor cores'
//         measured ceiling on the project's card (doc/design.md says how).
//   fp32: fp32 without tensor cores, the H200 SXM datasheet's figure (not measured).
#pragma once

namespace flashgpt2 {

constexpr double PEAK_BF16_TFLOPS = 790;
constexpr double PEAK_FP32_TFLOPS = 67;
constexpr const char* PEAK_BF16_NAME = "790 TFLOP/s H200 bf16 matmul ceiling";
constexpr const char* PEAK_FP32_NAME = "67 TFLOP/s H200 fp32 datasheet";

}  // namespace flashgpt2
