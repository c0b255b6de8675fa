// A grouped bar chart written as a PNG, with no plotting library: an RGB pixel buffer, filled rectangles,
// a hand-drawn 5×7 bitmap font, and stb_image_write to encode it. The dev/ ladders draw their benchmark
// results with it (groups = problem shapes, one coloured bar per kernel, log-scale y axis, legend below).
//   plot::BarChart c; c.title = ...; c.groups = {...}; c.series = {...}; c.values[series][group] = ...;
//   plot::write_bar_chart_png("doc/attention_forward.png", c);   // a value <= 0 or NaN draws no bar
// The font knows A–Z (lower case is drawn as upper case), 0–9 and a little punctuation; other characters
// show as '?'.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "llmc/error.h"

#define STB_IMAGE_WRITE_STATIC  // private copy in this translation unit: no clash with another user of stb
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

namespace flashgpt2::plot {

// ---- the font: each glyph is 7 rows of 5 pixels, '#' = ink ----
struct Glyph {
    char c;
    const char* rows[7];
};
inline const Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"####.", "#...#", "#...#", "#...#", "#...#", "#...#", "####."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
    {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};

inline const Glyph& glyph(char c) {
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    for (const Glyph& g : kFont)
        if (g.c == c) return g;
    return kFont[sizeof(kFont) / sizeof(kFont[0]) - 1];  // '?'
}

struct Rgb {
    uint8_t r, g, b;
};

// ---- a canvas: RGB pixels, rectangles and text ----
class Canvas {
  public:
    Canvas(int w, int h, Rgb bg) : w_(w), h_(h), px_((size_t)w * h * 3) { fill(0, 0, w, h, bg); }
    int width() const { return w_; }
    int height() const { return h_; }

    void fill(int x0, int y0, int x1, int y1, Rgb c) {  // [x0, x1) × [y0, y1), clipped to the canvas
        x0 = std::max(x0, 0), y0 = std::max(y0, 0), x1 = std::min(x1, w_), y1 = std::min(y1, h_);
        for (int y = y0; y < y1; y++)
            for (int x = x0; x < x1; x++) {
                uint8_t* p = &px_[((size_t)y * w_ + x) * 3];
                p[0] = c.r, p[1] = c.g, p[2] = c.b;
            }
    }

    // Each font pixel becomes a scale×scale square; a glyph advances 6·scale (one column of spacing).
    static int text_width(const std::string& s, int scale) { return (int)s.size() * 6 * scale - scale; }
    void text(int x, int y, const std::string& s, int scale, Rgb c) {
        for (char ch : s) {
            const Glyph& g = glyph(ch);
            for (int row = 0; row < 7; row++)
                for (int col = 0; col < 5; col++)
                    if (g.rows[row][col] == '#')
                        fill(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale, c);
            x += 6 * scale;
        }
    }

    void write_png(const std::string& path) const {  // to "<path>.tmp", then renamed: never half-written
        const std::string tmp = path + ".tmp";
        if (!stbi_write_png(tmp.c_str(), w_, h_, 3, px_.data(), w_ * 3)) fail("%s: cannot write the PNG", tmp.c_str());
        if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("%s: cannot rename to %s", tmp.c_str(), path.c_str());
    }

  private:
    int w_, h_;
    std::vector<uint8_t> px_;
};

// ---- the chart ----
struct BarChart {
    std::string title, subtitle, footnote;
    std::vector<std::string> groups;           // along x: one cluster of bars per group
    std::vector<std::string> series;           // one colour per series, named in the legend
    std::vector<std::vector<double>> values;   // [series][group]; <= 0 or NaN: no bar (failed / not run)
};

inline Rgb series_color(size_t i, size_t n_series, size_t n_anchor_free) {
    static const Rgb palette[] = {{213, 94, 0},   {230, 159, 0},  {240, 200, 40}, {86, 180, 233},
                                  {0, 114, 178},  {0, 158, 115},  {120, 200, 120}, {204, 121, 167},
                                  {150, 80, 160}, {90, 60, 140},  {170, 110, 60}, {60, 160, 160}};
    if (i >= n_anchor_free) return (i - n_anchor_free) % 2 ? Rgb{40, 40, 40} : Rgb{140, 140, 140};
    (void)n_series;
    return palette[i % (sizeof(palette) / sizeof(palette[0]))];
}

// Series named like an anchor ("PyTorch FA2", "cuDNN") are drawn in greys after the coloured ones.
inline void write_bar_chart_png(const std::string& path, const BarChart& c) {
    const size_t G = c.groups.size(), S = c.series.size();
    if (G == 0 || S == 0 || c.values.size() != S) fail("%s: bar chart needs groups, series and values[series][group]", path.c_str());
    for (const auto& v : c.values)
        if (v.size() != G) fail("%s: bar chart values must have one entry per group", path.c_str());
    size_t n_colored = S;
    while (n_colored > 0 && (c.series[n_colored - 1] == "cuDNN" || c.series[n_colored - 1] == "PyTorch FA2")) n_colored--;

    // Log-scale y axis from the decade below the smallest value to the decade above the largest.
    double lo = INFINITY, hi = 0;
    for (const auto& v : c.values)
        for (double x : v)
            if (x > 0 && std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
    if (!(hi > 0)) lo = 1, hi = 10;
    const int dlo = (int)std::floor(std::log10(lo)), dhi = std::max(dlo + 1, (int)std::ceil(std::log10(hi)));

    const int W = 1600, legend_cols = 4, legend_rows = (int)((S + legend_cols - 1) / legend_cols);
    const int top = 110, plot_h = 480, bottom_axis = 50, H = top + plot_h + bottom_axis + 30 * legend_rows + 40;
    const int left = 90, right = W - 30, y0 = top, y1 = top + plot_h;
    const Rgb white{255, 255, 255}, ink{20, 20, 20}, grid{215, 215, 215}, soft{110, 110, 110};
    Canvas cv(W, H, white);
    cv.text(left, 16, c.title, 3, ink);
    cv.text(left, 52, c.subtitle, 2, soft);
    cv.text(left, 76, c.footnote, 1, soft);

    auto y_of = [&](double v) { return y1 - (int)std::lround((std::log10(v) - dlo) / (dhi - dlo) * plot_h); };
    for (int d = dlo; d <= dhi; d++) {  // a grid line and a label per decade
        const int y = y_of(std::pow(10.0, d));
        cv.fill(left, y, right, y + 1, grid);
        char b[32];
        snprintf(b, sizeof b, "%.*f", std::max(0, -d), std::pow(10.0, d));  // 0.1, 1, 10, 100, ...
        cv.text(left - 10 - Canvas::text_width(b, 2), y - 7, b, 2, ink);
    }
    cv.fill(left, y0, left + 1, y1 + 1, ink);  // y axis
    cv.fill(left, y1, right, y1 + 1, ink);     // x axis

    const double group_w = double(right - left) / G, bar_w = group_w * 0.85 / S;
    for (size_t g = 0; g < G; g++) {
        const int gx = left + (int)(g * group_w + group_w * 0.075);
        for (size_t s = 0; s < S; s++) {
            const int x0 = gx + (int)(s * bar_w), x1 = gx + (int)((s + 1) * bar_w) - 2;
            const double v = c.values[s][g];
            if (!(v > 0) || !std::isfinite(v)) {  // no bar: a small dash on the axis says "not measured"
                cv.fill(x0, y1 - 3, x1, y1 - 1, soft);
                continue;
            }
            const int y = std::min(y_of(v), y1 - 1);
            cv.fill(x0, y, x1, y1, series_color(s, S, n_colored));
            char b[32];
            snprintf(b, sizeof b, v < 10 ? "%.1f" : "%.0f", v);
            cv.text((x0 + x1) / 2 - Canvas::text_width(b, 1) / 2, y - 10, b, 1, ink);
        }
        const int label_w = Canvas::text_width(c.groups[g], 2);
        cv.text(left + (int)(g * group_w + group_w / 2) - label_w / 2, y1 + 14, c.groups[g], 2, ink);
    }
    for (size_t s = 0; s < S; s++) {  // legend: colour box + name, legend_cols per row
        const int x = left + (int)(s % legend_cols) * (right - left) / legend_cols;
        const int y = y1 + bottom_axis + (int)(s / legend_cols) * 30;
        cv.fill(x, y, x + 22, y + 16, series_color(s, S, n_colored));
        cv.text(x + 30, y + 1, c.series[s], 2, ink);
    }
    cv.write_png(path);
}

}  // namespace flashgpt2::plot
