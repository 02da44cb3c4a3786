"""C source of the fused CPU kernels (`cpu_fused.py` compiles and calls them).

Two units, compiled with different floating-point rules:

- EXACT (no reassociation, no FMA contraction): RMSNorm with the residual add, rotary with the
  K/V write. Each step rounds where torch's op-by-op code rounds (bf16: after every op), so
  rotary and the residual add give torch's bits; RMSNorm differs only by the order of its sum
  of squares: an ulp of the scale at most (bf16 outputs measured bit-equal to torch's; float32
  ones differ in the last bit).
- FAST (-ffast-math: vectorised `expf`, reassociated sums): decode attention, whose torch
  counterpart (SDPA) has its own summation order anyway.

Each body is written once with the placeholders `SUF` (function suffix), `T_` (storage type),
`LD(x)` (to float) and `RND(x)` (float rounded to the storage type, kept as float), `ST(x)`
(float to storage); `render` instantiates it for float32 and bfloat16.
"""

from __future__ import annotations

PRELUDE = r"""
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
"""

EXACT = r"""
/* hidden[n, h] += delta (+ bias, added to delta first, as `out + bias`); then
   out = w * RND(x * rsqrt(mean(x^2) + eps)) with x = hidden in float. delta may be NULL. */
void add_rms_norm_SUF(T_ *hidden, const T_ *delta, const T_ *bias, const T_ *w, T_ *out,
                      int64_t n, int64_t h, float eps) {
    for (int64_t i = 0; i < n; i++) {
        T_ *x = hidden + i * h;
        if (delta) {
            const T_ *dl = delta + i * h;
            for (int64_t j = 0; j < h; j++) {
                float add = LD(dl[j]);
                if (bias) add = RND(add + LD(bias[j]));
                x[j] = ST(LD(x[j]) + add);
            }
        }
        float part[16] = {0};
        int64_t j = 0;
        for (; j + 16 <= h; j += 16)
            for (int k = 0; k < 16; k++) part[k] += LD(x[j + k]) * LD(x[j + k]);
        for (; j < h; j++) part[0] += LD(x[j]) * LD(x[j]);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += part[k];
        float r = 1.0f / sqrtf(sum / (float)h + eps);
        T_ *o = out + i * h;
        for (j = 0; j < h; j++) o[j] = ST(LD(w[j]) * RND(LD(x[j]) * r));
    }
}

/* qkv [n, row] holds q (hq heads), k (hkv heads), v (hkv heads) of width d per token. Rotates
   q into q_out [n, hq, d] and k into k_flat[slot], copies v into v_flat[slot] (flat pools
   [slots, hkv, d]); cos/sin tables [positions, d]: x * cos + rotate_half(x) * sin. */
void rotary_kv_SUF(const T_ *qkv, int64_t row, const T_ *cos_t, const T_ *sin_t,
                   const int64_t *pos, const int64_t *slots, int64_t n, int64_t hq, int64_t hkv,
                   int64_t d, T_ *q_out, T_ *k_flat, T_ *v_flat) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < n; i++) {
        const T_ *src = qkv + i * row;
        const T_ *c = cos_t + pos[i] * d, *s = sin_t + pos[i] * d;
        for (int64_t hh = 0; hh < hq + hkv; hh++) {
            const T_ *x = src + hh * d;
            T_ *dst = hh < hq ? q_out + (i * hq + hh) * d : k_flat + (slots[i] * hkv + hh - hq) * d;
            for (int64_t j = 0; j < half; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(-LD(x[j + half]) * LD(s[j])));
            for (int64_t j = half; j < d; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(LD(x[j - half]) * LD(s[j])));
        }
        memcpy(v_flat + slots[i] * hkv * d, src + (hq + hkv) * d, sizeof(T_) * hkv * d);
    }
}
"""

FAST_PRELUDE = r"""
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define HAVE_VECTORS 1
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

static inline v16f ldv_f32(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16f ldv_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* out[t] = the sum of p[t]'s 16 lanes, for 16 vectors at once: four rounds that each add
   pairs of lanes from two vectors into one (15 adds instead of 16 separate reductions) */
static inline v16f sum_lanes16(v16f *p) {
    v16f q[8], r[4], s[2];
    for (int i = 0; i < 8; i++)
        q[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24,
                                       10, 26, 12, 28, 14, 30) +
               __builtin_shufflevector(p[2 * i], p[2 * i + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25,
                                       11, 27, 13, 29, 15, 31);
    for (int i = 0; i < 4; i++)
        r[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9,
                                       24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(q[2 * i], q[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                       26, 27, 14, 15, 30, 31);
    for (int i = 0; i < 2; i++)
        s[i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9,
                                       10, 11, 24, 25, 26, 27) +
               __builtin_shufflevector(r[2 * i], r[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13,
                                       14, 15, 28, 29, 30, 31);
    return __builtin_shufflevector(s[0], s[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                   22, 23) +
           __builtin_shufflevector(s[0], s[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                   29, 30, 31);
}
#endif
"""

FAST = r"""
#ifdef HAVE_VECTORS
/* The scores of a full 16-token page: for each query head, 16 per-token vectors of partial
   products (d / 16 multiply-adds each), summed across lanes together. */
static inline __attribute__((always_inline)) void page_scores_SUF(
    const float *qf, const T_ *page_rows, int64_t g, int64_t hkv, int64_t d, int64_t len,
    int64_t t0, float *scores) {
    for (int64_t h = 0; h < hkv; h++)
        for (int64_t gi = 0; gi < g; gi++) {
            const float *qh = qf + (h * g + gi) * d;
            v16f part[16];
            for (int o = 0; o < 16; o++) {
                const T_ *k = page_rows + (o * hkv + h) * d;
                v16f acc = ldv_f32(qh) * ldv_SUF(k);
                for (int64_t c = 16; c < d; c += 16) acc += ldv_f32(qh + c) * ldv_SUF(k + c);
                part[o] = acc;
            }
            v16f sums = sum_lanes16(part);
            memcpy(scores + (h * g + gi) * len + t0, &sums, sizeof sums);
        }
}

/* acc[qh] = sum_t p[qh, t] v_t for the nb query heads qh0 .. qh0 + nb - 1 (all reading kv
   head h): their accumulators stay in registers (nb * d / 16 vectors, at most 16) while the
   tokens' value rows stream past. */
static inline __attribute__((always_inline)) void value_block_SUF(
    const T_ *v_pool, const int32_t *pages, int64_t len, int64_t h, int64_t hkv, int64_t d,
    int64_t ps, int64_t num_pages, const float *scores, int64_t qh0, int nb, float *acc,
    const T_ *fetch_pool, const int32_t *fetch_pages, int64_t fetch_count) {
    v16f a[4][8];
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < d / 16; c++) a[i][c] = (v16f){0};
    for (int64_t t0 = 0; t0 < len; t0 += ps) {
        int64_t page = clamp_page(pages[t0 / ps], num_pages);
        for (int64_t f = t0 / ps; f < fetch_count && f < t0 / ps + 1; f++)
            prefetch_page(fetch_pool + clamp_page(fetch_pages[f], num_pages) * ps * hkv * d,
                          (int64_t)sizeof(T_) * ps * hkv * d);
        int64_t m = len - t0 < ps ? len - t0 : ps;
        for (int64_t o = 0; o < m; o++) {
            const T_ *v = v_pool + ((page * ps + o) * hkv + h) * d;
            for (int c = 0; c < d / 16; c++) {
                v16f x = ldv_SUF(v + 16 * c);
                for (int i = 0; i < nb; i++) a[i][c] += scores[(qh0 + i) * len + t0 + o] * x;
            }
        }
    }
    for (int i = 0; i < nb; i++) memcpy(acc + (qh0 + i) * d, a[i], sizeof(float) * (size_t)d);
}
#endif

/* Attention of one request's query heads (qf: scaled, float [hq, d]) to its `len` keys, into
   acc [hq, d] (normalised). Token by token over all kv heads (a token's K or V row is one
   contiguous run of hkv * d values), the next page prefetched. Inlined with constant d and
   ps for the common shapes, so the row loops unroll into whole vectors. */
static inline __attribute__((always_inline)) void attend_SUF(
    const float *qf, const T_ *k_pool, const T_ *v_pool, const int32_t *pages, int64_t len,
    int64_t g, int64_t hkv, int64_t d, int64_t ps, int64_t num_pages, float *scores, float *row,
    float *acc, const int32_t *next_pages, int64_t next_count) {
    int64_t hq = g * hkv, width = hkv * d, npages = (len + ps - 1) / ps;
    int64_t page_bytes = (int64_t)sizeof(T_) * ps * width;
    for (int pass = 0; pass < 2; pass++) {
        const T_ *pool = pass == 0 ? k_pool : v_pool;
#ifdef HAVE_VECTORS
        if (pass == 1 && d % 16 == 0 && d <= 128) {
            int most = d <= 64 ? 4 : 2; /* query heads per block: at most 16 accumulators */
            for (int64_t h = 0; h < hkv; h++)
                for (int64_t qh = h * g, nb; qh < (h + 1) * g; qh += nb) {
                    nb = (h + 1) * g - qh < most ? (h + 1) * g - qh : most;
                    /* a constant block size each, so the accumulators are registers */
#define VALUE_BLOCK(n)                                                                    \
    value_block_SUF(v_pool, pages, len, h, hkv, d, ps, num_pages, scores, qh, n, acc, k_pool, \
                    next_pages, qh == 0 ? next_count : 0)
                    if (nb == 4) VALUE_BLOCK(4);
                    else if (nb == 3) VALUE_BLOCK(3);
                    else if (nb == 2) VALUE_BLOCK(2);
                    else VALUE_BLOCK(1);
#undef VALUE_BLOCK
                }
            break;
        }
#endif
        if (pass == 1) memset(acc, 0, sizeof(float) * (size_t)(hq * d));
        for (int64_t pi = 0; pi < npages; pi++) {
            int64_t page = clamp_page(pages[pi], num_pages);
            if (pi + 2 < npages) {  /* two pages ahead */
                prefetch_page(pool + clamp_page(pages[pi + 2], num_pages) * ps * width, page_bytes);
            if (pass == 0)  /* the V pass reads this page next */
                prefetch_page(v_pool + page * ps * width, page_bytes);
            }
            int64_t t0 = pi * ps, m = len - t0 < ps ? len - t0 : ps;
#ifdef HAVE_VECTORS
            if (pass == 0 && ps == 16 && m == 16 && d % 16 == 0) {
                page_scores_SUF(qf, pool + page * ps * width, g, hkv, d, len, t0, scores);
                continue;
            }
#endif
            for (int64_t o = 0; o < m; o++) {
                const T_ *src = pool + (page * ps + o) * width;
                for (int64_t j = 0; j < width; j++) row[j] = LD(src[j]);
                for (int64_t h = 0; h < hkv; h++) {
                    const float *r = row + h * d;
                    for (int64_t gi = 0; gi < g; gi++) {
                        int64_t qh = h * g + gi;
                        if (pass == 0) {
                            float dot = 0.0f;
                            for (int64_t j = 0; j < d; j++) dot += qf[qh * d + j] * r[j];
                            scores[qh * len + t0 + o] = dot;
                        } else {
                            float p = scores[qh * len + t0 + o];
                            for (int64_t j = 0; j < d; j++) acc[qh * d + j] += p * r[j];
                        }
                    }
                }
            }
        }
        if (pass == 1) break;
        for (int64_t qh = 0; qh < hq; qh++) {
            float *sc = scores + qh * len, top = sc[0], total = 0.0f;
            for (int64_t t = 1; t < len; t++) top = sc[t] > top ? sc[t] : top;
            for (int64_t t = 0; t < len; t++) {
                sc[t] = expf(sc[t] - top);
                total += sc[t];
            }
            float inv = 1.0f / total;
            for (int64_t t = 0; t < len; t++) sc[t] *= inv;
        }
    }
}

/* One query per request against its paged K/V (pools [pages, ps, hkv, d]); query head h reads
   kv head h / (hq / hkv). Float32 softmax; a request with no key gets zeros. */
/* decode attention for requests first .. last - 1 */
static void attend_rows_SUF(const T_ *q, const T_ *k_pool, const T_ *v_pool,
                            const int32_t *table, int64_t table_stride, const int32_t *lens,
                            int64_t first, int64_t last, int64_t hq, int64_t hkv, int64_t d,
                            int64_t ps, int64_t num_pages, float scale, T_ *out) {
    int64_t g = hq / hkv, cap = 0;
    float *scores = NULL;
    float *qf = malloc(sizeof(float) * (size_t)(2 * hq * d + hkv * d));
    float *acc = qf + hq * d, *row = acc + hq * d;
    for (int64_t bi = first; bi < last; bi++) {
        int64_t len = lens[bi];
        T_ *oh = out + bi * hq * d;
        if (len <= 0) {
            for (int64_t j = 0; j < hq * d; j++) oh[j] = ST(0.0f);
            continue;
        }
        if (len > cap) {
            cap = len;
            free(scores);
            scores = malloc(sizeof(float) * (size_t)(hq * cap));
        }
        const int32_t *pages = table + bi * table_stride;
        /* the V pass prefetches the next request's K pages, one per page it reads */
        const int32_t *next = bi + 1 < last ? pages + table_stride : NULL;
        int64_t next_count = next ? (lens[bi + 1] + ps - 1) / ps : 0;
        for (int64_t j = 0; j < hq * d; j++) qf[j] = LD(q[bi * hq * d + j]) * scale;
        if (d == 64 && ps == 16)
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, 64, 16, num_pages, scores, row,
                       acc, next, next_count);
        else if (d == 128 && ps == 16)
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, 128, 16, num_pages, scores, row,
                       acc, next, next_count);
        else
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, d, ps, num_pages, scores, row,
                       acc, next, next_count);
        for (int64_t j = 0; j < hq * d; j++) oh[j] = ST(acc[j]);
    }
    free(scores);
    free(qf);
}

void decode_attention_SUF(const T_ *q, const T_ *k_pool, const T_ *v_pool, const int32_t *table,
                          int64_t table_stride, const int32_t *lens, int64_t b, int64_t hq,
                          int64_t hkv, int64_t d, int64_t ps, int64_t num_pages, float scale,
                          T_ *out) {
#ifdef _OPENMP
    /* OpenMP is torch's own runtime here, so this follows torch's thread count: each thread
       takes a contiguous run of requests */
    if (b > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
            attend_rows_SUF(q, k_pool, v_pool, table, table_stride, lens, b * id / nt,
                            b * (id + 1) / nt, hq, hkv, d, ps, num_pages, scale, out);
        }
        return;
    }
#endif
    attend_rows_SUF(q, k_pool, v_pool, table, table_stride, lens, 0, b, hq, hkv, d, ps,
                    num_pages, scale, out);
}
"""

# (suffix, storage type, to float, round, to storage)
TYPES = [
    ("f32", "float", "(x)", "(x)", "(x)"),
    ("bf16", "uint16_t", "bf2f(x)", "bf2f(f2bf(x))", "f2bf(x)"),
]


def render(body: str, prelude: str = "") -> str:
    """The unit's C source: the preludes, then `body` once per storage type."""
    out = [PRELUDE, prelude]
    for suffix, storage, load, rnd, store in TYPES:
        macros = f"#define LD(x) {load}\n#define RND(x) {rnd}\n#define ST(x) {store}\n"
        text = body.replace("SUF", suffix).replace("T_", storage)
        out.append(macros + text + "#undef LD\n#undef RND\n#undef ST\n")
    return "\n".join(out)
