// The attention kernels' work order (llmc/attention/schedule.h): every (head, tile) item exactly once,
// heaviest first inside each L2 section, and the section sizes. The expected orders are built here by nested
// loops, the way the header's comment states the order, not by its division and remainder.
#include <doctest/doctest.h>
#include <vector>

#include "llmc/attention/schedule.h"

using flashgpt2::HeadTile;

namespace {

// sections of `sh` heads in order; in each, rank 0 of every head, then rank 1, ...
std::vector<HeadTile> expected_order(int BH, int n, int sh) {
    std::vector<HeadTile> out;
    for (int first = 0; first < BH; first += sh)
        for (int rank = 0; rank < n; rank++)
            for (int bh = first; bh < first + sh && bh < BH; bh++) out.push_back({bh, rank});
    return out;
}

}  // namespace

TEST_CASE("heaviest_first: each (head, tile) once, heaviest first in each section") {
    struct Case {
        int BH, n, sh;
    };
    // sections that divide the heads, a short last section, one head, one tile, one section of all heads
    for (const Case c : {Case{12, 256, 4}, Case{96, 16, 64}, Case{13, 5, 4}, Case{1, 7, 16}, Case{7, 1, 3},
                         Case{768, 16, 64}, Case{5, 3, 5}, Case{48, 64, 48}}) {
        CAPTURE(c.BH);
        CAPTURE(c.n);
        CAPTURE(c.sh);
        const std::vector<HeadTile> want = expected_order(c.BH, c.n, c.sh);
        REQUIRE(want.size() == (size_t)c.BH * c.n);
        std::vector<int> seen((size_t)c.BH * c.n, 0);
        int wrong = 0;
        for (int item = 0; item < c.BH * c.n; item++) {
            const HeadTile t = flashgpt2::heaviest_first(item, c.n, c.BH, c.sh);
            REQUIRE((t.bh >= 0 && t.bh < c.BH && t.rank >= 0 && t.rank < c.n));
            seen[(size_t)t.bh * c.n + t.rank]++;
            wrong += t.bh != want[item].bh || t.rank != want[item].rank;
        }
        CHECK(wrong == 0);
        for (int k : seen) REQUIRE(k == 1);
    }
}

TEST_CASE("l2_section_heads and balanced_section_heads") {
    // 16 MB / (T · HS · 4 bytes), at least 1
    CHECK(flashgpt2::l2_section_heads(1024, 64) == 64);
    CHECK(flashgpt2::l2_section_heads(4096, 64) == 16);
    CHECK(flashgpt2::l2_section_heads(16384, 64) == 4);
    CHECK(flashgpt2::l2_section_heads(2048, 128) == 16);
    CHECK(flashgpt2::l2_section_heads(32768, 128) == 1);
    CHECK(flashgpt2::l2_section_heads(65536, 128) == 1);  // 0.5 heads: still one
    CHECK(flashgpt2::l2_section_heads(1000, 64) == 65);   // 16777216 / 256000 = 65.5
    // as many sections as at most `sh` heads each need, of equal size
    CHECK(flashgpt2::balanced_section_heads(96, 64) == 48);
    CHECK(flashgpt2::balanced_section_heads(192, 64) == 64);
    CHECK(flashgpt2::balanced_section_heads(100, 64) == 50);
    CHECK(flashgpt2::balanced_section_heads(13, 4) == 4);  // 4 sections: 4 + 4 + 4 + 1
    CHECK(flashgpt2::balanced_section_heads(12, 64) == 12);
    CHECK(flashgpt2::balanced_section_heads(1, 1) == 1);
}
