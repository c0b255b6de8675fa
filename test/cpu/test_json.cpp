// Tests of llmc/json.h, the JSON reader behind the safetensors header and config.json (encoder.json's reader,
// built on the same cursor, is tested with the tokenizer): values of every kind, exact 64-bit integers, and the
// malformed documents it must refuse with a message that names the file and the byte.
#include <doctest/doctest.h>

#include <string>

#include "llmc/json.h"
#include "test/cpu/data_helpers.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;
using json::Value;

TEST_CASE("json: objects, arrays, strings, numbers, true, false and null, members in file order") {
    const Value v = json::parse(R"( {"b": [1, -2.5e3, 0], "a": {"x": "caf\u00e9 \ud83d\ude00", "t": true, "f": false, "n": null}, "e": [], "o": {}} )", "t.json");
    REQUIRE(v.is(Value::Type::object));
    REQUIRE(v.members.size() == 4);
    CHECK(v.members[0].first == "b");  // file order, not sorted
    const Value* b = v.find("b");
    REQUIRE(b);
    REQUIRE(b->items.size() == 3);
    CHECK(b->items[1].text == "-2.5e3");  // numbers keep their text
    const Value* a = v.find("a");
    REQUIRE(a);
    CHECK(a->find("x")->text == "caf\xC3\xA9 \xF0\x9F\x98\x80");
    CHECK(a->find("t")->boolean);
    CHECK(a->find("f")->is(Value::Type::boolean));
    CHECK(!a->find("f")->boolean);
    CHECK(a->find("n")->is(Value::Type::null));
    CHECK(v.find("e")->is(Value::Type::array));
    CHECK(v.find("o")->members.empty());
    CHECK(v.find("missing") == nullptr);
}

TEST_CASE("json: integers read exactly up to 2^64 - 1; fractions, exponents and negatives are not integers") {
    uint64_t n = 0;
    CHECK(json::parse("18446744073709551615", "t").to_u64(&n));
    CHECK(n == 18446744073709551615ull);
    CHECK(json::parse("9007199254740993", "t").to_u64(&n));  // 2^53 + 1: a double would round it
    CHECK(n == 9007199254740993ull);
    CHECK(!json::parse("18446744073709551616", "t").to_u64(&n));
    CHECK(!json::parse("1.0", "t").to_u64(&n));
    CHECK(!json::parse("1e3", "t").to_u64(&n));
    CHECK(!json::parse("-1", "t").to_u64(&n));
    CHECK(!json::parse("\"12\"", "t").to_u64(&n));
}

TEST_CASE("json: malformed documents are Errors naming the file and the byte") {
    const std::pair<const char*, const char*> bad[] = {
        {"{\"a\": 1", "expected '}'"}, {"[1, 2", "expected ']'"}, {"{\"a\" 1}", "expected ':'"}, {"01", "unexpected text after the value"},
        {"-", "malformed number"}, {"1.", "malformed number"}, {"tru", "expected a value"}, {"\"a\nb\"", "control character"},
        {"{\"k\": 1, \"k\": 2}", "repeated key \"k\""}, {"\"\\ud800\"", "high surrogate without a low surrogate"},
        {"[1] [2]", "unexpected text after the value"}, {"", "expected a value"},
    };
    for (const auto& [text, what] : bad) {
        CAPTURE(text);
        const std::string e = error_of([&] { json::parse(text, "bad.json"); });
        CHECK(contains(e, "bad.json: JSON error at byte "));
        CHECK(contains(e, what));
    }
    CHECK(contains(error_of([] { json::parse(std::string(65, '[') + std::string(65, ']'), "deep.json"); }), "nested too deeply"));
    CHECK(error_of([] { json::parse(std::string(60, '[') + std::string(60, ']'), "ok.json"); }) == "(no error)");
}

TEST_CASE("json: quote() escapes what JSON requires, and parse() reads it back") {
    const std::string s = "quote \" backslash \\ newline \n tab \t bell \x07 caf\xC3\xA9";
    const std::string quoted = json::quote(s);
    CHECK(quoted == "\"quote \\\" backslash \\\\ newline \\u000a tab \\u0009 bell \\u0007 caf\xC3\xA9\"");
    CHECK(json::parse(quoted, "q").text == s);
}
