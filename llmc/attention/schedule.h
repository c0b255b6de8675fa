// The order in which a causal attention grid takes its work: (head, tile) items, heaviest first, in L2 sections.
//
// Causal tiles are unequal. In the forward and the backward's dQ kernel the last query tile of a sequence sees
// every key tile and the first sees one; in the dK/dV kernel it is the first key tile that every query tile
// sees. The hardware gives a grid's blocks to the SMs in index order as room frees up, and a persistent grid's
// counter hands out items in order too, so the order of the items is a schedule. Longest first (Graham 1969,
// "LPT") leaves short items for the end, so no SM is left alone with a long one while the others idle.
// Longest first across all heads at once would scatter the re-read tiles (K, V for the forward and dQ; Q, dO
// for dK/dV) of every head over L2, so heads are taken in sections whose re-read tiles fit in L2 together.
//
// Plain C++ so that the CPU tests check the order (test/cpu/test_schedule.cpp); the kernels call it on device.
#pragma once
#include <cstddef>

#if defined(__CUDACC__)
#define SCHEDULE_HD __host__ __device__
#else
#define SCHEDULE_HD
#endif

namespace flashgpt2 {

// A work item: head bh of B·NH, and the rank of its tile in the head's own order, 0 the heaviest.
struct HeadTile {
    int bh, rank;
};

// Item `item` of B·NH heads of n_tiles tiles each: sections of section_heads heads (the last may have
// fewer), and inside a section every head's rank-0 tile, then every head's rank-1 tile, and so on.
SCHEDULE_HD inline HeadTile heaviest_first(int item, int n_tiles, int BH, int section_heads) {
    const int per_section = section_heads * n_tiles;
    const int sec = item / per_section, within = item - sec * per_section;
    const int left = BH - sec * section_heads;
    const int heads = section_heads < left ? section_heads : left;  // heads in this section
    return HeadTile{sec * section_heads + within % heads, within / heads};
}

// Heads per section: as many as have two (T, HS) bf16 tensors (the re-read ones) in ~16 MB of L2.
SCHEDULE_HD inline int l2_section_heads(int T, int HS) {
    const int h = (int)((16u << 20) / ((size_t)T * HS * 4));
    return h > 1 ? h : 1;
}

// The smallest section size that needs no more sections than section_heads does: 96 heads at 64 a section
// become 48 + 48, not 64 + 32, so that the last section, whose longest items start latest, is not a short
// one. (One size for all sections: 13 heads at 4 stay 4 + 4 + 4 + 1.)
SCHEDULE_HD inline int balanced_section_heads(int BH, int section_heads) {
    const int sections = (BH + section_heads - 1) / section_heads;
    return (BH + sections - 1) / sections;
}

}  // namespace flashgpt2
