/* What every CPU kernel library shares: torch's bfloat16 conversions, and reading a paged KV
   pool (a page id clamped into the pool, a page prefetched). */

#ifndef COMMON_H
#define COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even, as torch's float -> bfloat16 conversion (NaN stays a quiet NaN) */
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Start loading a page's rows (`bytes` of them) into the cache while the current one is used. */
/* a page id read from a page table, clamped into the pool */
static inline int64_t clamp_page(int64_t page, int64_t num_pages) {
    return page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
}

static inline void prefetch_page(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

#endif
