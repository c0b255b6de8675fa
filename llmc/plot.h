// The project's one plotting module: charts written as PNGs with no plotting library, just an RGB pixel buffer,
// filled rectangles and lines, a hand-drawn 5x7 bitmap font, and stb_image_write to encode the pixels.
//   Bar charts (dev/ ladders: groups = problem shapes, one coloured bar per kernel, log-scale y, legend below):
//     plot::BarChart c; c.title = ...; c.groups = {...}; c.series = {...}; c.values[series][group] = ...;
//     plot::write_bar_chart_png("doc/results/attention_forward.png", c);  // a value <= 0 or NaN: no bar
//   Line charts (loss curves, tools/plot_loss.cpp; anything of y against x):
//     plot::LineChart c; c.title = ...; c.series.push_back({"flash val", xs, ys, plot::palette(1), 3, true});
//     plot::write_line_chart_png("doc/results/loss.png", c);     // linear axes with round-number ticks
// The font knows A-Z (lower case is drawn as upper case), 0-9 and some punctuation; other characters show as '?'.
// PNGs are written atomically (llmc/fileio.h): never half-written under the real name.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "llmc/error.h"
#include "llmc/fileio.h"

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
    {'[', {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."}},
    {']', {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."}},
    {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
    {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
    {'\'', {"..#..", "..#..", ".#...", ".....", ".....", ".....", "....."}},
    {'*', {".....", "#.#.#", ".###.", "#####", ".###.", "#.#.#", "....."}},
    {'#', {".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#."}},
    {'|', {"..#..", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'!', {"..#..", "..#..", "..#..", "..#..", "..#..", ".....", "..#.."}},
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

    // A line of the given width from (x0, y0) to (x1, y1): a square brush stepped along it, one pixel at a time.
    void line(double x0, double y0, double x1, double y1, int width, Rgb c) {
        const int n = std::max(1, (int)std::ceil(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))));
        const int lo = width / 2, hi = width - width / 2;
        for (int i = 0; i <= n; i++) {
            const int x = (int)std::lround(x0 + (x1 - x0) * i / n), y = (int)std::lround(y0 + (y1 - y0) * i / n);
            fill(x - lo, y - lo, x + hi, y + hi, c);
        }
    }

    void write_png(const std::string& path) const {
        int len = 0;
        unsigned char* png = stbi_write_png_to_mem(px_.data(), w_ * 3, w_, h_, 3, &len);
        if (!png) fail("%s: cannot encode the PNG", path.c_str());
        try {
            write_file_atomic(path, {{png, (size_t)len}});
        } catch (...) {
            free(png);
            throw;
        }
        free(png);
    }

  private:
    int w_, h_;
    std::vector<uint8_t> px_;
};

// ---- colours and the legend, shared by the charts ----

// Distinguishable colours by index, repeating after 12; the first seven follow Wong's colour-blind-safe palette
// (B. Wong, "Color blindness", Nature Methods 8, 441, 2011), its yellow darkened to show on white.
inline Rgb palette(size_t i) {
    static const Rgb colors[] = {{213, 94, 0},   {0, 114, 178},  {0, 158, 115},  {230, 159, 0},
                                 {204, 121, 167}, {86, 180, 233}, {240, 200, 40}, {120, 200, 120},
                                 {150, 80, 160},  {90, 60, 140},  {170, 110, 60}, {60, 160, 160}};
    return colors[i % (sizeof(colors) / sizeof(colors[0]))];
}

// c mixed with white: t = 0 gives c, t = 1 white (a lighter shade of the same colour).
inline Rgb lighter(Rgb c, double t) {
    auto mix = [&](uint8_t v) { return (uint8_t)std::lround(v + (255 - v) * t); };
    return {mix(c.r), mix(c.g), mix(c.b)};
}

// Legend rows from y down: a colour box and a name per entry, cols entries per row across [left, right).
inline void draw_legend(Canvas& cv, const std::vector<std::string>& names, const std::vector<Rgb>& colors, int left,
                        int right, int y, int cols) {
    const Rgb ink{20, 20, 20};
    for (size_t s = 0; s < names.size(); s++) {
        const int x = left + (int)(s % cols) * (right - left) / cols, row_y = y + (int)(s / cols) * 30;
        cv.fill(x, row_y, x + 22, row_y + 16, colors[s]);
        cv.text(x + 30, row_y + 1, names[s], 2, ink);
    }
}

// ---- the bar chart ----
struct BarChart {
    std::string title, subtitle, footnote;
    std::vector<std::string> groups;           // along x: one cluster of bars per group
    std::vector<std::string> series;           // one colour per series, named in the legend
    std::vector<std::vector<double>> values;   // [series][group]; <= 0 or NaN: no bar (failed / not run)
};

inline Rgb series_color(size_t i, size_t n_anchor_free) {
    static const size_t order[] = {0, 3, 6, 5, 1, 2, 7, 4, 8, 9, 10, 11};  // the ladder's warm-to-cool sequence
    if (i >= n_anchor_free) return (i - n_anchor_free) % 2 ? Rgb{40, 40, 40} : Rgb{140, 140, 140};
    return palette(order[i % 12]);
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
            cv.fill(x0, y, x1, y1, series_color(s, n_colored));
            char b[32];
            snprintf(b, sizeof b, v < 10 ? "%.1f" : "%.0f", v);
            cv.text((x0 + x1) / 2 - Canvas::text_width(b, 1) / 2, y - 10, b, 1, ink);
        }
        const int label_w = Canvas::text_width(c.groups[g], 2);
        cv.text(left + (int)(g * group_w + group_w / 2) - label_w / 2, y1 + 14, c.groups[g], 2, ink);
    }
    std::vector<Rgb> colors;
    for (size_t s = 0; s < S; s++) colors.push_back(series_color(s, n_colored));
    draw_legend(cv, c.series, colors, left, right, y1 + bottom_axis, legend_cols);
    cv.write_png(path);
}

// ---- the line chart ----
struct Series {
    std::string name;          // in the legend
    std::vector<double> x, y;  // the points, in drawing order; non-finite ones are skipped
    Rgb color;
    int width = 2;             // line width in pixels
    bool dots = false;         // mark every point (for sparse series, e.g. a validation loss every N steps)
};

struct LineChart {
    std::string title, subtitle, x_label, y_label;
    std::vector<Series> series;
};

// Round-number ticks covering [lo, hi]: a step of 1, 2 or 5 times a power of ten giving at most max_ticks
// intervals; the axis then runs from the tick at or below lo to the one at or above hi.
struct Ticks {
    double first, step;
    int count;  // ticks at first + i * step, i = 0 .. count - 1
    double last() const { return first + (count - 1) * step; }
};
inline Ticks nice_ticks(double lo, double hi, int max_ticks) {
    if (!(hi > lo)) lo -= 0.5, hi += 0.5;  // one value: a unit-wide axis around it
    const double raw = (hi - lo) / max_ticks, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = 10 * mag;
    for (double m : {1.0, 2.0, 5.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    const double first = std::floor(lo / step + 1e-9) * step, last = std::ceil(hi / step - 1e-9) * step;
    return {first, step, (int)std::lround((last - first) / step) + 1};
}

// A tick's label with as many decimals as its step needs (0.5 -> "0.5", 2000 -> "2000").
inline std::string tick_label(double v, double step) {
    char b[32];
    const int decimals = std::max(0, -(int)std::floor(std::log10(step) + 1e-9));
    snprintf(b, sizeof b, "%.*f", decimals, std::fabs(v) < step * 1e-6 ? 0.0 : v);
    return b;
}

// The plot area of a line chart (pixels: x right, y down), shared with the tests.
struct Frame {
    int left, top, right, bottom;
};
inline Frame line_chart_frame() { return {110, 120, 1160, 640}; }

inline void write_line_chart_png(const std::string& path, const LineChart& c) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (const Series& s : c.series) {
        if (s.x.size() != s.y.size()) fail("%s: series '%s' has %zu x and %zu y values", path.c_str(), s.name.c_str(), s.x.size(), s.y.size());
        for (size_t i = 0; i < s.x.size(); i++)
            if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]))
                xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]), ylo = std::min(ylo, s.y[i]), yhi = std::max(yhi, s.y[i]);
    }
    if (!std::isfinite(xlo)) fail("%s: line chart has no finite point to draw", path.c_str());
    if (!(xhi > xlo)) xlo -= 0.5, xhi += 0.5;
    const Ticks yt = nice_ticks(ylo, yhi, 8), xt = nice_ticks(xlo, xhi, 10);

    const Frame f = line_chart_frame();
    const int legend_cols = 2, legend_rows = (int)((c.series.size() + legend_cols - 1) / legend_cols);
    const int W = f.right + 40, H = f.bottom + 90 + 30 * legend_rows + 20;
    const Rgb white{255, 255, 255}, ink{20, 20, 20}, grid{225, 225, 225}, soft{110, 110, 110};
    Canvas cv(W, H, white);
    cv.text(f.left, 18, c.title, 3, ink);
    cv.text(f.left, 54, c.subtitle, 2, soft);

    // data -> pixels: x over [xlo, xhi] (the data's own span), y over the ticks' span
    auto px = [&](double x) { return f.left + (x - xlo) / (xhi - xlo) * (f.right - f.left); };
    auto py = [&](double y) { return f.bottom - (y - yt.first) / (yt.last() - yt.first) * (f.bottom - f.top); };
    for (int i = 0; i < yt.count; i++) {
        const double v = yt.first + i * yt.step;
        const int y = (int)std::lround(py(v));
        cv.fill(f.left, y, f.right, y + 1, grid);
        const std::string b = tick_label(v, yt.step);
        cv.text(f.left - 12 - Canvas::text_width(b, 2), y - 7, b, 2, ink);
    }
    for (int i = 0; i < xt.count; i++) {
        const double v = xt.first + i * xt.step;
        if (v < xlo - 1e-9 * xt.step || v > xhi + 1e-9 * xt.step) continue;  // ticks outside the data's span
        const int x = (int)std::lround(px(v));
        cv.fill(x, f.top, x + 1, f.bottom, grid);
        const std::string b = tick_label(v, xt.step);
        cv.text(x - Canvas::text_width(b, 2) / 2, f.bottom + 12, b, 2, ink);
    }
    cv.fill(f.left, f.top, f.left + 1, f.bottom + 1, ink);     // y axis
    cv.fill(f.left, f.bottom, f.right, f.bottom + 1, ink);     // x axis
    cv.text(f.left - 12 - Canvas::text_width(c.y_label, 2), f.top - 34, c.y_label, 2, ink);
    cv.text((f.left + f.right) / 2 - Canvas::text_width(c.x_label, 2) / 2, f.bottom + 40, c.x_label, 2, ink);

    for (const Series& s : c.series) {
        bool have_last = false;
        double lx = 0, ly = 0;
        for (size_t i = 0; i < s.x.size(); i++) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
            const double x = px(s.x[i]), y = py(s.y[i]);
            if (have_last) cv.line(lx, ly, x, y, s.width, s.color);
            if (s.dots) cv.fill((int)x - 3, (int)y - 3, (int)x + 4, (int)y + 4, s.color);
            lx = x, ly = y, have_last = true;
        }
    }
    std::vector<std::string> names;
    std::vector<Rgb> colors;
    for (const Series& s : c.series) names.push_back(s.name), colors.push_back(s.color);
    draw_legend(cv, names, colors, f.left, f.right, f.bottom + 80, legend_cols);
    cv.write_png(path);
}

}  // namespace flashgpt2::plot
