// Tests of llmc/plot.h, the project's one plotting module: round-number axis ticks, and charts checked in the decoded
// PNG's pixels (stb_image reads them back): where each line lies, that the axes span the data, that the bar chart keeps
// its colours, and that bad input is an Error.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "llmc/plot.h"
#include "test/cpu/data_helpers.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>

using namespace flashgpt2;
using namespace flashgpt2::testing;
using std::string;
using std::vector;

namespace {

struct Image {
    int w = 0, h = 0;
    vector<unsigned char> px;  // RGB
    plot::Rgb at(int x, int y) const {
        const unsigned char* p = &px[((size_t)y * w + x) * 3];
        return {p[0], p[1], p[2]};
    }
};

Image load_png(const string& path) {
    Image im;
    int n = 0;
    unsigned char* data = stbi_load(path.c_str(), &im.w, &im.h, &n, 3);
    REQUIRE_MESSAGE(data != nullptr, path);
    im.px.assign(data, data + (size_t)im.w * im.h * 3);
    stbi_image_free(data);
    return im;
}

bool same(plot::Rgb a, plot::Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }

// The rows of column x (between y0 and y1) that have colour c; empty when none.
vector<int> rows_with(const Image& im, int x, int y0, int y1, plot::Rgb c) {
    vector<int> rows;
    for (int y = y0; y < y1; y++)
        if (same(im.at(x, y), c)) rows.push_back(y);
    return rows;
}

}  // namespace

TEST_CASE("plot: ticks are 1, 2 or 5 times a power of ten and cover the range; labels carry the decimals they need") {
    auto check = [](double lo, double hi, int max_ticks, double first, double step, int count) {
        CAPTURE(lo);
        CAPTURE(hi);
        const plot::Ticks t = plot::nice_ticks(lo, hi, max_ticks);
        CHECK(t.first == doctest::Approx(first));
        CHECK(t.step == doctest::Approx(step));
        CHECK(t.count == count);
    };
    check(6.2, 10.9, 8, 6, 1, 6);      // (10.9 - 6.2) / 8 = 0.59: 0.5 is too fine, 1 is the next
    check(0, 250, 10, 0, 50, 6);       // 25 per tick wanted: 50
    check(3.14, 3.14, 8, 2.6, 0.2, 7);  // one value: a unit-wide range around it, [2.64, 3.64]
    check(0.011, 0.019, 4, 0.01, 0.002, 6);
    CHECK(plot::tick_label(0.5, 0.1) == "0.5");
    CHECK(plot::tick_label(2000, 500) == "2000");
    CHECK(plot::tick_label(6, 1) == "6");
    CHECK(plot::tick_label(-1e-17, 0.2) == "0.0");  // rounding noise at zero is not "-0.0"
}

TEST_CASE("plot: a line chart draws each series where its values are, across the whole x span") {
    TempDir d;
    plot::LineChart c;
    c.title = "test chart";
    c.x_label = "step";
    c.y_label = "loss";
    const plot::Rgb red{200, 30, 30}, blue{30, 30, 200};
    plot::Series falling{"falling", {}, {}, red, 3, false}, flat{"flat", {}, {}, blue, 3, true};
    for (int x = 0; x <= 100; x++) falling.x.push_back(x), falling.y.push_back(10 - x / 10.0);
    for (int x = 0; x <= 100; x += 10) flat.x.push_back(x), flat.y.push_back(1);
    c.series = {falling, flat};
    plot::write_line_chart_png(d / "c.png", c);
    const Image im = load_png(d / "c.png");
    const plot::Frame f = plot::line_chart_frame();
    REQUIRE(im.w > f.right);
    REQUIRE(im.h > f.bottom);
    auto column = [&](double frac) { return f.left + (int)std::lround(frac * (f.right - f.left)); };

    // at 10% of the way the falling line (y = 9) is far above the flat one (y = 1); at 80% (y = 2) it is lower
    // than it was, still above the flat one; the flat one stays on one height
    const vector<int> r10 = rows_with(im, column(0.1), f.top, f.bottom, red), b10 = rows_with(im, column(0.1), f.top, f.bottom, blue);
    const vector<int> r80 = rows_with(im, column(0.8), f.top, f.bottom, red), b80 = rows_with(im, column(0.8), f.top, f.bottom, blue);
    REQUIRE(!r10.empty());
    REQUIRE(!b10.empty());
    REQUIRE(!r80.empty());
    REQUIRE(!b80.empty());
    CHECK(r10.back() < b10.front() - 100);
    CHECK(r80.front() > r10.back() + 100);
    CHECK(r80.back() < b80.front());
    CHECK(std::abs(b10.front() - b80.front()) <= 1);
    // the y axis' ticks run from 0 to 10, so y = 9 is 90% of the way up and y = 1 10%
    CHECK(std::abs(r10.front() + 1 - (f.bottom - 0.9 * (f.bottom - f.top))) <= 3);
    CHECK(std::abs(b10.front() + 1 - (f.bottom - 0.1 * (f.bottom - f.top))) <= 3);
    // x spans the data: the falling line starts at the frame's left edge and ends at its right edge
    int first_col = -1, last_col = -1;
    for (int x = f.left - 5; x <= f.right + 5; x++)
        if (!rows_with(im, x, f.top - 5, f.bottom + 5, red).empty()) {
            if (first_col < 0) first_col = x;
            last_col = x;
        }
    CHECK(std::abs(first_col - f.left) <= 2);
    CHECK(std::abs(last_col - f.right) <= 2);
    // the legend, below the frame, has a box of each colour
    bool legend_red = false, legend_blue = false;
    for (int y = f.bottom + 60; y < im.h; y++)
        for (int x = 0; x < im.w; x++) legend_red |= same(im.at(x, y), red), legend_blue |= same(im.at(x, y), blue);
    CHECK(legend_red);
    CHECK(legend_blue);
}

TEST_CASE("plot: the bar chart keeps the ladder's colours; bad charts are Errors naming the file") {
    CHECK(same(plot::series_color(0, 4), {213, 94, 0}));
    CHECK(same(plot::series_color(1, 4), {230, 159, 0}));
    CHECK(same(plot::series_color(3, 4), {86, 180, 233}));
    CHECK(same(plot::series_color(4, 4), {140, 140, 140}));  // the first anchor (cuDNN, FA2) is grey
    TempDir d;
    plot::BarChart b;
    b.title = "bars";
    b.groups = {"T=1K", "T=8K"};
    b.series = {"naive", "flash"};
    b.values = {{1.0, 10.0}, {0.5, 2.0}};
    plot::write_bar_chart_png(d / "b.png", b);
    const Image im = load_png(d / "b.png");
    CHECK(im.w == 1600);
    bool orange = false;
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++) orange |= same(im.at(x, y), {213, 94, 0});
    CHECK(orange);

    b.values = {{1.0}, {0.5, 2.0}};
    CHECK(contains(error_of([&] { plot::write_bar_chart_png(d / "x.png", b); }), "one entry per group"));
    plot::LineChart empty;
    empty.series = {{"nan", {0, 1}, {NAN, NAN}, {0, 0, 0}, 2, false}};
    CHECK(contains(error_of([&] { plot::write_line_chart_png(d / "x.png", empty); }), d / "x.png"));
    empty.series = {{"ok", {0, 1}, {1, 2}, {0, 0, 0}, 2, false}};
    CHECK(contains(error_of([&] { plot::write_line_chart_png(d / "no/such/dir/x.png", empty); }), "no/such/dir/x.png.tmp"));
    CHECK(!std::filesystem::exists(d / "x.png"));
}
