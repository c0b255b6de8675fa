// The matmul algorithm table's file format (llmc/matmul_algos.h): what is written is read back exactly, and a
// file that is not such a table, or a line that does not parse, is one error naming the file and the line.
// The expected text of a one-call table is spelled out here, not produced by the formatter under test.
#include <doctest/doctest.h>
#include <string>

#include "llmc/matmul_algos.h"

using namespace flashgpt2;

namespace {

MatmulAlgoTable two_calls() {
    MatmulAlgoTable t;
    t.device = "NVIDIA H200 | 132 SMs | cuBLASLt 130000";
    MatmulChoice a;
    a.algo = {0x0123456789abcdefull, 0, 1, 0xffffffffffffffffull, 7, 8, 9, 10};
    a.us = 97.25f, a.pick = 3, a.candidates = 8;
    t.calls[{2304, 16384, 768, 1, 0, 768, 768, 2304, 4, -1, (256ll << 32) | 256, 256}] = a;
    MatmulChoice b;  // the heuristic's first, not timed
    b.algo = {1, 2, 3, 4, 5, 6, 7, 8};
    t.calls[{768, 2304, 16384, 0, 1, 768, 2304, 768, 1, -1, (16ll << 32) | 256, 256}] = b;
    return t;
}

const std::string GOOD_HEADER = "# flashgpt2 matmul algorithms v1\ndevice card | 1 SMs | cuBLASLt 1\n";
const std::string GOOD_CALL = "call 1 2 3 0 1 4 5 6 1 -1 68719476752 16 algo 0000000000000001 0000000000000002 "
                              "0000000000000003 0000000000000004 0000000000000005 0000000000000006 000000000000000a "
                              "00000000000000ff us 12.50 pick 1 of 4\n";

}  // namespace

TEST_CASE("matmul algorithm table: the text of one call") {
    MatmulAlgoTable t;
    t.device = "card | 1 SMs | cuBLASLt 1";
    MatmulChoice c;
    c.algo = {1, 2, 3, 4, 5, 6, 10, 255};
    c.us = 12.5f, c.pick = 1, c.candidates = 4;
    t.calls[{1, 2, 3, 0, 1, 4, 5, 6, 1, -1, (16ll << 32) | 16, 16}] = c;
    CHECK(format_matmul_algos(t) == GOOD_HEADER + GOOD_CALL);
    const MatmulAlgoTable back = parse_matmul_algos(GOOD_HEADER + GOOD_CALL, "t.txt");
    REQUIRE(back.calls.size() == 1);
    const auto& [key, got] = *back.calls.begin();
    CHECK(key == MatmulKey{1, 2, 3, 0, 1, 4, 5, 6, 1, -1, 68719476752ll, 16});
    CHECK(got.algo == std::array<uint64_t, 8>{1, 2, 3, 4, 5, 6, 10, 255});
    CHECK(got.us == 12.5f);
    CHECK(got.pick == 1);
    CHECK(got.candidates == 4);
    CHECK(back.device == "card | 1 SMs | cuBLASLt 1");
}

TEST_CASE("matmul algorithm table: written, then read back exactly") {
    const MatmulAlgoTable t = two_calls();
    const MatmulAlgoTable back = parse_matmul_algos(format_matmul_algos(t), "t.txt");
    CHECK(back.device == t.device);
    REQUIRE(back.calls.size() == t.calls.size());
    for (const auto& [key, c] : t.calls) {
        REQUIRE(back.calls.count(key) == 1);
        const MatmulChoice& b = back.calls.at(key);
        CHECK(b.algo == c.algo);
        CHECK(b.us == c.us);
        CHECK(b.pick == c.pick);
        CHECK(b.candidates == c.candidates);
    }
    // a table without calls is its header only, and reads back empty
    MatmulAlgoTable none;
    none.device = "x";
    CHECK(parse_matmul_algos(format_matmul_algos(none), "t.txt").calls.empty());
}

TEST_CASE("matmul algorithm table: what is not one is one error naming the file and the line") {
    auto err = [](const std::string& text) -> std::string {
        try {
            parse_matmul_algos(text, "run/matmul_algos.txt");
        } catch (const Error& e) {
            return e.what();
        }
        return "(no error)";
    };
    CHECK(err("") .find("run/matmul_algos.txt: not a matmul algorithm table") != std::string::npos);
    CHECK(err("call 1 2 3\n").find("not a matmul algorithm table") != std::string::npos);
    CHECK(err("# flashgpt2 matmul algorithms v1\n").find("line 2") != std::string::npos);
    CHECK(err("# flashgpt2 matmul algorithms v1\ndevice \n").find("line 2") != std::string::npos);
    CHECK(err(GOOD_HEADER + GOOD_CALL) == "(no error)");
    std::string s = GOOD_CALL;
    const std::string cases[] = {
        "call 1 2 3 0 1 4 5 6 1 -1 68719476752 algo 1\n",                       // a key integer missing
        s.replace(s.find(" 0000000000000002"), 17, " 00000000000002"),        // a short hex word
        std::string(GOOD_CALL).replace(GOOD_CALL.find("000a"), 4, "000G"),    // not hex
        std::string(GOOD_CALL).replace(GOOD_CALL.find("pick 1 of 4"), 11, "pick 4 of 4"),  // pick out of range
        std::string(GOOD_CALL).replace(GOOD_CALL.find("us 12.50"), 8, "us -1"),            // negative time
        std::string(GOOD_CALL).replace(GOOD_CALL.find("\n"), 1, " extra\n"),               // trailing words
    };
    for (const std::string& bad : cases) {
        INFO(bad);
        CHECK(err(GOOD_HEADER + bad).find("run/matmul_algos.txt line 3: expected 'call") != std::string::npos);
    }
    CHECK(err(GOOD_HEADER + GOOD_CALL + GOOD_CALL).find("line 4: a second line for the same call") != std::string::npos);
}
