// The GPU test suite's entry point: doctest collects every TEST_CASE in test/gpu/*.cu (per-layer kernels,
// attention, the whole model). Without a CUDA GPU it says so in one line and exits 1 (listing the tests,
// e.g. --list-test-cases, works anywhere: it runs none of them).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "llmc/common.cuh"

int main(int argc, char** argv) {
    bool only_listing = false;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        only_listing = only_listing || a.rfind("--list", 0) == 0 || a.rfind("-l", 0) == 0 || a.rfind("--count", 0) == 0 ||
                       a.rfind("-count", 0) == 0 || a == "-h" || a == "--help" || a == "-?";
    }
    int count = 0;
    if (!only_listing) {
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            fprintf(stderr, "error: no CUDA GPU found: the GPU tests need one (on the lent H200: bash scripts/lent_gpu.sh)\n");
            return 1;
        }
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, 0));
        printf("GPU tests, %s build, on %s (sm_%d%d)\n", PRECISION_NAME, prop.name, prop.major, prop.minor);
    }
    doctest::Context context(argc, argv);
    return context.run();
}
