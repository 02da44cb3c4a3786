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

FP8_PRELUDE = r"""
/* fp8 storage (the KV pool's fp8_e4m3 / fp8_e5m2): a byte to float, exactly (finite values;
   the pool never stores NaN or inf, its writes clamp). Subnormals are built from the integer
   mantissa, not from float subnormals, so a flush-to-zero mode cannot lose them. */
static inline float e4m3_to_f32(uint8_t b) {
    uint32_t mag = b & 0x7fu, u;
    float f;
    if (mag < 8u) {
        f = (float)mag * 0.001953125f; /* mantissa * 2^-9 */
        memcpy(&u, &f, 4);
    } else {
        u = (mag << 20) + (120u << 23); /* exponent bias 7 -> 127 */
    }
    u |= (uint32_t)(b & 0x80u) << 24;
    memcpy(&f, &u, 4);
    return f;
}

static inline float e5m2_to_f32(uint8_t b) {
    uint32_t mag = b & 0x7fu, u;
    float f;
    if (mag < 4u) {
        f = (float)mag * 0.0000152587890625f; /* mantissa * 2^-16 */
        memcpy(&u, &f, 4);
    } else {
        u = (mag << 21) + (112u << 23); /* exponent bias 15 -> 127 */
    }
    u |= (uint32_t)(b & 0x80u) << 24;
    memcpy(&f, &u, 4);
    return f;
}
"""

EXACT_FP8_PRELUDE = r"""
/* float to fp8 with `mbits` mantissa bits and exponent bias `bias`, rounded to nearest even,
   as torch's conversion (finite inputs within the type's range: the callers clamp). Below the
   smallest normal the value is a multiple of the subnormal step, rounded as an integer count
   of steps (adding and removing 2^23 rounds a float to an integer, to nearest even). */
static inline uint8_t f32_to_fp8(float f, int mbits, int bias, float steps_per_unit) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u < (uint32_t)(128 - bias) << 23) {
        float a, r;
        memcpy(&a, &u, 4);
        r = (a * steps_per_unit + 8388608.0f) - 8388608.0f;
        return (uint8_t)(sign | (uint8_t)r);
    }
    int shift = 23 - mbits;
    u += ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);
    u -= (uint32_t)(127 - bias) << 23;
    return (uint8_t)(sign | (uint8_t)(u >> shift));
}

static inline uint8_t enc_e4m3(float f) { return f32_to_fp8(f, 3, 7, 512.0f); }

static inline uint8_t enc_e5m2(float f) { return f32_to_fp8(f, 2, 15, 65536.0f); }
"""

EXACT_FP8 = r"""
/* x (float) as the pool stores it: minus the offset (NULL: none), times the reciprocal scale,
   clamped to the type's range, rounded: the operations and order of KVPool.write */
static inline KV_ quantize_SUF(float x, const float *off, int64_t j, float inv) {
    if (off) x = x - off[j];
    x = x * inv;
    x = x > KVMAX ? KVMAX : (x < -KVMAX ? -KVMAX : x);
    return ENC(x);
}

/* rotary_kv for an fp8 pool: q as there; k (rotated, rounded to T_ as there) and v stored
   through quantize_SUF with the layer's offsets [hkv, d] (NULL: none) and reciprocal scales */
void rotary_kv_SUF(const T_ *qkv, int64_t row, const T_ *cos_t, const T_ *sin_t,
                   const int64_t *pos, const int64_t *slots, int64_t n, int64_t hq, int64_t hkv,
                   int64_t d, T_ *q_out, KV_ *k_flat, KV_ *v_flat, const float *k_off,
                   const float *v_off, float k_inv, float v_inv) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < n; i++) {
        const T_ *src = qkv + i * row;
        const T_ *c = cos_t + pos[i] * d, *s = sin_t + pos[i] * d;
        for (int64_t hh = 0; hh < hq + hkv; hh++) {
            const T_ *x = src + hh * d;
            T_ rot[512];
            T_ *dst = hh < hq ? q_out + (i * hq + hh) * d : rot;
            for (int64_t j = 0; j < half; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(-LD(x[j + half]) * LD(s[j])));
            for (int64_t j = half; j < d; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(LD(x[j - half]) * LD(s[j])));
            if (hh < hq) continue;
            int64_t h = hh - hq;
            KV_ *kd = k_flat + (slots[i] * hkv + h) * d;
            const float *off = k_off ? k_off + h * d : NULL;
            for (int64_t j = 0; j < d; j++) kd[j] = quantize_SUF(LD(rot[j]), off, j, k_inv);
        }
        const T_ *v = src + (hq + hkv) * d;
        KV_ *vd = v_flat + slots[i] * hkv * d;
        for (int64_t j = 0; j < hkv * d; j++) vd[j] = quantize_SUF(LD(v[j]), v_off, j, v_inv);
    }
}
"""

FAST_PRELUDE = r"""
#ifdef _OPENMP
#include <omp.h>
#endif
/* Another library's thread pool that decode attention splits its requests over instead of
   OpenMP (set_attention_runner; NULL: OpenMP): a quantized model's projections run on the
   quantized kernels' pool, whose worker spins between jobs, and an OpenMP team beside it
   would want the same cores. */
typedef void (*par_fn)(void *args, int part, int parts);
typedef void (*par_runner)(par_fn fn, void *args, int parts);
static par_runner attention_runner;
/* context length from which one request's decode attention splits its kv heads over the
   runner's threads (shorter: the hand-off costs about what the split saves) */
#define MIN_LEN_TO_SPLIT 32
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

FAST_FP8_PRELUDE = r"""
#ifdef HAVE_VECTORS
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));

/* 16 fp8 bytes to floats, as e4m3_to_f32 / e5m2_to_f32 lane by lane: `mbits` mantissa bits,
   `rebias` the exponent bias difference to float's, `tiny` the subnormal step */
static inline v16f ldv_fp8(const uint8_t *p, int mbits, uint32_t rebias, float tiny) {
    v16b b;
    memcpy(&b, p, sizeof b);
    v16u u = __builtin_convertvector(b, v16u);
    v16u mag = u & 0x7fu;
    v16u normal = (mag << (23 - mbits)) + (rebias << 23);
    v16f sub = __builtin_convertvector((v16i)mag, v16f) * tiny;
    v16u sub_bits;
    memcpy(&sub_bits, &sub, sizeof sub);
    v16u is_sub = (v16u)(mag < (1u << mbits)); /* all ones where the exponent field is 0 */
    v16u bits = (sub_bits & is_sub) | (normal & ~is_sub) | ((u & 0x80u) << 24);
    v16f v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline v16f ldv_e4m3(const uint8_t *p) { return ldv_fp8(p, 3, 120u, 0.001953125f); }

static inline v16f ldv_e5m2(const uint8_t *p) { return ldv_fp8(p, 2, 112u, 0.0000152587890625f); }
#endif
"""

FAST = r"""
#ifdef HAVE_VECTORS
/* The scores of a full 16-token page: for each query head, 16 per-token vectors of partial
   products (d / 16 multiply-adds each), summed across lanes together. */
static inline __attribute__((always_inline)) void page_scores_SUF(
    const float *qf, const KV_ *page_rows, int64_t g, int64_t hkv, int64_t h0, int64_t h1,
    int64_t d, int64_t len, int64_t t0, float *scores) {
    for (int64_t h = h0; h < h1; h++)
        for (int64_t gi = 0; gi < g; gi++) {
            const float *qh = qf + (h * g + gi) * d;
            v16f part[16];
            for (int o = 0; o < 16; o++) {
                const KV_ *k = page_rows + (o * hkv + h) * d;
                v16f acc = ldv_f32(qh) * ldv_KVS(k);
                for (int64_t c = 16; c < d; c += 16) acc += ldv_f32(qh + c) * ldv_KVS(k + c);
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
    const KV_ *v_pool, const int32_t *pages, int64_t len, int64_t h, int64_t hkv, int64_t d,
    int64_t ps, int64_t num_pages, const float *scores, int64_t qh0, int nb, float *acc,
    const KV_ *fetch_pool, const int32_t *fetch_pages, int64_t fetch_count) {
    v16f a[4][8];
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < d / 16; c++) a[i][c] = (v16f){0};
    for (int64_t t0 = 0; t0 < len; t0 += ps) {
        int64_t page = clamp_page(pages[t0 / ps], num_pages);
        for (int64_t f = t0 / ps; f < fetch_count && f < t0 / ps + 1; f++)
            prefetch_page(fetch_pool + clamp_page(fetch_pages[f], num_pages) * ps * hkv * d,
                          (int64_t)sizeof(KV_) * ps * hkv * d);
        int64_t m = len - t0 < ps ? len - t0 : ps;
        for (int64_t o = 0; o < m; o++) {
            const KV_ *v = v_pool + ((page * ps + o) * hkv + h) * d;
            for (int c = 0; c < d / 16; c++) {
                v16f x = ldv_KVS(v + 16 * c);
                for (int i = 0; i < nb; i++) a[i][c] += scores[(qh0 + i) * len + t0 + o] * x;
            }
        }
    }
    for (int i = 0; i < nb; i++) memcpy(acc + (qh0 + i) * d, a[i], sizeof(float) * (size_t)d);
}
#endif

/* Attention of one request's query heads (qf: scaled, float [hq, d]) to its `len` keys, into
   acc [hq, d] (normalised), for the query heads of kv heads h0 .. h1 - 1 (each head's
   arithmetic the same whichever range it is in). Token by token over the kv heads (a token's
   K or V row is one contiguous run of hkv * d values), the next page prefetched. Inlined with
   constant d and ps for the common shapes, so the row loops unroll into whole vectors. */
static inline __attribute__((always_inline)) void attend_SUF(
    const float *qf, const KV_ *k_pool, const KV_ *v_pool, const int32_t *pages, int64_t len,
    int64_t g, int64_t hkv, int64_t h0, int64_t h1, int64_t d, int64_t ps, int64_t num_pages,
    float *scores, float *row, float *acc, const int32_t *next_pages, int64_t next_count) {
    int64_t hq = g * hkv, width = hkv * d, npages = (len + ps - 1) / ps;
    int64_t page_bytes = (int64_t)sizeof(KV_) * ps * width;
    for (int pass = 0; pass < 2; pass++) {
        const KV_ *pool = pass == 0 ? k_pool : v_pool;
#ifdef HAVE_VECTORS
        if (pass == 1 && d % 16 == 0 && d <= 128) {
            int most = d <= 64 ? 4 : 2; /* query heads per block: at most 16 accumulators */
            for (int64_t h = h0; h < h1; h++)
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
                page_scores_SUF(qf, pool + page * ps * width, g, hkv, h0, h1, d, len, t0, scores);
                continue;
            }
#endif
            for (int64_t o = 0; o < m; o++) {
                const KV_ *src = pool + (page * ps + o) * width;
                for (int64_t j = h0 * d; j < h1 * d; j++) row[j] = LDK(src[j]);
                for (int64_t h = h0; h < h1; h++) {
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
        for (int64_t qh = h0 * g; qh < h1 * g; qh++) {
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
/* decode attention for requests first .. last - 1, the query heads of kv heads h0 .. h1 - 1 */
static void attend_rows_SUF(const T_ *q, const KV_ *k_pool, const KV_ *v_pool,
                            const int32_t *table, int64_t table_stride, const int32_t *lens,
                            int64_t first, int64_t last, int64_t hq, int64_t hkv, int64_t h0,
                            int64_t h1, int64_t d, int64_t ps, int64_t num_pages, float scale,
                            T_ *out) {
    int64_t g = hq / hkv, cap = 0, j0 = h0 * g * d, j1 = h1 * g * d; /* their q / out values */
    float *scores = NULL;
    float *qf = malloc(sizeof(float) * (size_t)(2 * hq * d + hkv * d));
    float *acc = qf + hq * d, *row = acc + hq * d;
    for (int64_t bi = first; bi < last; bi++) {
        int64_t len = lens[bi];
        T_ *oh = out + bi * hq * d;
        if (len <= 0) {
            for (int64_t j = j0; j < j1; j++) oh[j] = ST(0.0f);
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
        for (int64_t j = j0; j < j1; j++) qf[j] = LD(q[bi * hq * d + j]) * scale;
        if (d == 64 && ps == 16)
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, 64, 16, num_pages, scores,
                       row, acc, next, next_count);
        else if (d == 128 && ps == 16)
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, 128, 16, num_pages,
                       scores, row, acc, next, next_count);
        else
            attend_SUF(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, d, ps, num_pages, scores,
                       row, acc, next, next_count);
        for (int64_t j = j0; j < j1; j++) oh[j] = ST(acc[j]);
    }
    free(scores);
    free(qf);
}

struct attend_job_SUF {
    const T_ *q;
    const KV_ *k_pool, *v_pool;
    const int32_t *table, *lens;
    int64_t table_stride, b, hq, hkv, d, ps, num_pages;
    float scale;
    T_ *out;
};

static void attend_part_SUF(void *p, int part, int parts) { /* a contiguous run of requests */
    const struct attend_job_SUF *j = p;
    attend_rows_SUF(j->q, j->k_pool, j->v_pool, j->table, j->table_stride, j->lens,
                    j->b * part / parts, j->b * (part + 1) / parts, j->hq, j->hkv, 0, j->hkv,
                    j->d, j->ps, j->num_pages, j->scale, j->out);
}

static void attend_heads_SUF(void *p, int part, int parts) { /* one request, a run of kv heads */
    const struct attend_job_SUF *j = p;
    attend_rows_SUF(j->q, j->k_pool, j->v_pool, j->table, j->table_stride, j->lens, 0, 1, j->hq,
                    j->hkv, j->hkv * part / parts, j->hkv * (part + 1) / parts, j->d, j->ps,
                    j->num_pages, j->scale, j->out);
}

void decode_attention_SUF(const T_ *q, const KV_ *k_pool, const KV_ *v_pool, const int32_t *table,
                          int64_t table_stride, const int32_t *lens, int64_t b, int64_t hq,
                          int64_t hkv, int64_t d, int64_t ps, int64_t num_pages, float scale,
                          T_ *out) {
#ifdef _OPENMP
    if (b > 1 && attention_runner && omp_get_max_threads() > 1) {
        struct attend_job_SUF j = {q, k_pool, v_pool, table, lens, table_stride, b, hq, hkv, d,
                                   ps, num_pages, scale, out};
        int parts = omp_get_max_threads();
        attention_runner(attend_part_SUF, &j, parts < b ? parts : (int)b);
        return;
    }
    /* one request with a long enough context: its kv heads split over the runner's threads
       (a batch-1 decode step's attention, while the other core would wait for the next
       product) */
    if (b == 1 && hkv > 1 && lens[0] >= MIN_LEN_TO_SPLIT && attention_runner &&
        omp_get_max_threads() > 1) {
        struct attend_job_SUF j = {q, k_pool, v_pool, table, lens, table_stride, b, hq, hkv, d,
                                   ps, num_pages, scale, out};
        int parts = omp_get_max_threads();
        attention_runner(attend_heads_SUF, &j, parts < hkv ? parts : (int)hkv);
        return;
    }
    /* OpenMP is torch's own runtime here, so this follows torch's thread count: each thread
       takes a contiguous run of requests */
    if (b > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
            attend_rows_SUF(q, k_pool, v_pool, table, table_stride, lens, b * id / nt,
                            b * (id + 1) / nt, hq, hkv, 0, hkv, d, ps, num_pages, scale, out);
        }
        return;
    }
#endif
    attend_rows_SUF(q, k_pool, v_pool, table, table_stride, lens, 0, b, hq, hkv, 0, hkv, d, ps,
                    num_pages, scale, out);
}
"""

ROPE_STEP = r"""
void set_attention_runner(par_runner runner) { attention_runner = runner; }

/* what stays the same for every layer of a decode-only step (rope_decode; cpu_fused.RopeStep) */
struct rope_decode_step {
    const void *cos, *sin;
    const int64_t *pos, *slots;
    const int32_t *table, *lens;
    int64_t table_stride, n, hq, hkv, d, ps, num_pages;
    void *q;
};
"""

ROPE_DECODE = r"""
/* A decode-only step's per-layer attention in one call: rotary_kv (the exact unit's: q into
   st->q, k and v into the pools at st->slots), then decode_attention of st->n requests. */

void rotary_kv_SUF(const T_ *qkv, int64_t row, const T_ *cos_t, const T_ *sin_t,
                   const int64_t *pos, const int64_t *slots, int64_t n, int64_t hq, int64_t hkv,
                   int64_t d, T_ *q_out, T_ *k_flat, T_ *v_flat);

void rope_decode_SUF(const struct rope_decode_step *st, const T_ *qkv, int64_t row, T_ *k_pool,
                     T_ *v_pool, float scale, T_ *out) {
    rotary_kv_SUF(qkv, row, st->cos, st->sin, st->pos, st->slots, st->n, st->hq, st->hkv, st->d,
                  st->q, k_pool, v_pool);
    decode_attention_SUF(st->q, k_pool, v_pool, st->table, st->table_stride, st->lens, st->n,
                         st->hq, st->hkv, st->d, st->ps, st->num_pages, scale, out);
}
"""

# (suffix, storage type, to float, round, to storage)
TYPES = [
    ("f32", "float", "(x)", "(x)", "(x)"),
    ("bf16", "uint16_t", "bf2f(x)", "bf2f(f2bf(x))", "f2bf(x)"),
]
# the KV pool's fp8 types: (suffix, to float, from float, largest value)
FP8_TYPES = [
    ("e4m3", "e4m3_to_f32(x)", "enc_e4m3(x)", "448.0f"),
    ("e5m2", "e5m2_to_f32(x)", "enc_e5m2(x)", "57344.0f"),
]


def render(
    body: str | list[tuple[str, tuple[str, ...]]], prelude: str = "", types: list | None = None
) -> str:
    """The unit's C source: PRELUDE and `prelude`, then each body once per storage type and
    KV pool type of its `kv` tuple: "same" (the pool holds the storage type; functions
    `<name>_f32`, ...), "fp8" (an fp8 pool: `<name>_f32_e4m3`, ...) or one fp8 type ("e4m3",
    "e5m2"). A plain string is one body with ("same",). In a body `KV_` / `KVS` / `LDK(x)` /
    `ENC(x)` / `KVMAX` name the pool's C type, suffix, conversions and largest value.
    `types`: the storage types (all of TYPES by default)."""
    out = [PRELUDE, prelude]
    for text, kv in [(body, ("same",))] if isinstance(body, str) else body:
        for storage_type in TYPES if types is None else types:
            out += _instances(text, storage_type, kv)
    return "\n".join(out)


def _instances(body: str, storage_type: tuple[str, ...], kv: tuple[str, ...]) -> list[str]:
    suffix, storage, load, rnd, store = storage_type
    macros = f"#define LD(x) {load}\n#define RND(x) {rnd}\n#define ST(x) {store}\n"
    undef = "#undef LD\n#undef RND\n#undef ST\n"
    out = []
    if "same" in kv:  # substituted, no macros: the source of before fp8 pools, byte for byte
        text = body.replace("KVS", suffix).replace("KV_", storage).replace("LDK(", "LD(")
        out.append(macros + text.replace("SUF", suffix).replace("T_", storage) + undef)
    for fp8, load8, store8, top in [t for t in FP8_TYPES if "fp8" in kv or t[0] in kv]:
        text = body.replace("KVS", fp8).replace("KV_", "uint8_t")
        text = text.replace("SUF", f"{suffix}_{fp8}").replace("T_", storage)
        kv_macros = f"#define LDK(x) {load8}\n#define ENC(x) {store8}\n#define KVMAX {top}\n"
        out.append(macros + kv_macros + text + undef + "#undef LDK\n#undef ENC\n#undef KVMAX\n")
    return out
