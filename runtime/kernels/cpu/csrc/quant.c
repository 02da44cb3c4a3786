/* The quantized-weight kernels (quant.py compiles and calls them).

   Weights stay in GGUF's block formats, row by row as the file stores them (a row of `cols`
   inputs is `cols / block` blocks of `type_size` bytes). Three kinds of functions:

   - `q_dequant`: rows of any supported type to float32, each value computed as the `gguf`
     package's numpy reference computes it (same operations, same order, no FMA contraction:
     the unit is built with -ffp-contract=off), so the two agree bit for bit.
   - Integer products for the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): each input row is
     quantized to int16 in blocks of 32 (scale `d = max|x| / 32767`, `s = d * sum(q)`), each
     weight block is unpacked to 32 signed int8 values (Q4_0: q - 8, Q5_0: q - 16, Q4_1 / Q5_1:
     q as is, their minimum `m` handled as `m * s`), and a block's dot product is exact integer
     arithmetic (int8 x int16 pairs: `vpmaddwd`, or `vpdpwssd` with VNNI). int16, not llama.cpp's
     int8: int8 inputs moved SmolLM2's logits by ~0.1-0.2 and its greedy tokens parted from the
     fp32 forward's on 12 of 20 prompts within 32 tokens; int16 inputs cost one more multiply
     per block and keep the products within float rounding of the fp32 forward. The int32 sums
     sit in 16 lanes (lane j: elements 2j and 2j + 1), each lane accumulated in float as
     `fma(sum, d_w * d_x, acc)` (even and odd blocks in two accumulators); a row ends with a
     fixed lane-sum tree plus the sums of the `m * s` terms. The portable code computes
     exactly those lanes and that tree, so the SIMD and portable builds give the same bits.
   - The K-quants (Q4_K, Q5_K, Q6_K) on the same int16 inputs: each weight row is unpacked once
     for every input row into int16 values with the sub-block scales folded in (k_unpack), and
     each 32-element block then takes the arithmetic above (k_rows).
   - Fused dequantization for the rest (F16, BF16, F32): a block is dequantized into a small
     buffer and multiplied in float32 against the unquantized input, in 8 lanes.

   SIMD: AVX-512 (one block per 512-bit `vpdpwssd` with VNNI, `vpmaddwd` without), else AVX2 +
   FMA (two 256-bit `vpmaddwd` a block); the library is compiled with -march=native on first use, so
   the CPU that runs it decides which. `QUANT_PORTABLE` builds plain C.
   Several input rows (prefill, a batch's decode) share each unpacked weight block: 4 rows at a
   time, each row's arithmetic that of one row alone (results do not depend on the batch). */

#include "pool.h"
#include "common.h"

#define MIN_PARALLEL 65536 /* weights (elements) below which one thread does it all */

#include <math.h>
#include <stdint.h>
#include <string.h>
#if !defined(QUANT_PORTABLE) && defined(__AVX2__) && defined(__FMA__)
#define Q_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define Q_AVX512 1
#endif
#endif

#define Q_INLINE static inline __attribute__((always_inline))

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30 };

/* IEEE half to float, exact (as numpy's astype(float32)) */
static inline float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(Q_AVX2) && defined(__F16C__)
    return _cvtsh_ss(h); /* the same exact conversion, one instruction */
#endif
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, man = h & 1023, u;
    if (e == 0) {
        float f = (float)man * 5.9604644775390625e-08f; /* man * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((e + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16f(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* block size (elements) and bytes of each type; 0: not supported */
static int q_block(int t) {
    switch (t) {
    case T_F32: case T_F16: case T_BF16: return 1;
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: return 32;
    case T_Q4_K: case T_Q5_K: case T_Q6_K: return 256;
    }
    return 0;
}

static int q_bytes(int t) {
    switch (t) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    }
    return 0;
}

/* the 6-bit scale and minimum of sub-block i (0..7) of a Q4_K / Q5_K block */
static inline void k_scale_min(const uint8_t *s, int i, int *sc, int *m) {
    if (i < 4) {
        *sc = s[i] & 63;
        *m = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 15) | ((s[i - 4] >> 6) << 4);
        *m = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

/* one block of type t at b to float (q_block(t) values), as gguf's numpy reference */
static void dequant_block(int t, const uint8_t *b, float *out) {
    switch (t) {
    case T_F32: memcpy(out, b, 4); return;
    case T_F16: out[0] = h2f(b); return;
    case T_BF16: out[0] = bf16f(b); return;
    case T_Q4_0: {
        float d = h2f(b);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((b[2 + j] & 15) - 8);
            out[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        return;
    }
    case T_Q4_1: {
        float d = h2f(b), m = h2f(b + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(b[4 + j] & 15) + m;
            out[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        return;
    }
    case T_Q5_0: {
        float d = h2f(b);
        uint32_t qh = le32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)(lo - 16);
            out[j + 16] = d * (float)(hi - 16);
        }
        return;
    }
    case T_Q5_1: {
        float d = h2f(b), m = h2f(b + 2);
        uint32_t qh = le32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)lo + m;
            out[j + 16] = d * (float)hi + m;
        }
        return;
    }
    case T_Q8_0: {
        float d = h2f(b);
        for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)b[2 + j] * d;
        return;
    }
    case T_Q4_K: case T_Q5_K: {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc6 = b + 4, *qh = b + 16, *qs = b + (t == T_Q4_K ? 16 : 48);
        for (int i = 0; i < 8; i++) {
            int sc, m;
            k_scale_min(sc6, i, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *q = qs + (i / 2) * 32;
            for (int l = 0; l < 32; l++) {
                int v = (i & 1) ? (q[l] >> 4) : (q[l] & 15);
                if (t == T_Q5_K) v |= ((qh[l] >> i) & 1) << 4;
                out[i * 32 + l] = ds * (float)v - dm;
            }
        }
        return;
    }
    case T_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        for (int e = 0; e < 256; e++) {
            int c = e / 128, r = e % 128;
            int lo = (ql[c * 64 + r % 64] >> (4 * (r / 64))) & 15;
            int hi = (qh[c * 32 + r % 32] >> (2 * (r / 32))) & 3;
            out[e] = (d * (float)sc[e / 16]) * (float)((lo | (hi << 4)) - 32);
        }
        return;
    }
    }
}

/* rows [rows][row_bytes] of type t with `cols` values each -> out [rows][cols] float32;
   returns 0, or -1 for a type this code does not know */


/* ---- the integer path: 32-element blocks ---------------------------------------------------- */

/* x [n] (float32, or bf16 when `bf16`) in int16 blocks of 32: q [n], d [n/32], s [n/32] */
#ifdef Q_AVX2
/* quantize_row's block b in 8-float vectors: the same values (the maximum and the products are
   exact operations, round-to-nearest-even as nearbyintf, the clamp and the integer sum alike) */
static inline void quantize_block_v(const void *xv, int bf16, int64_t b, int16_t *q, float *d,
                                    float *s, int8_t *h, uint8_t *l, int32_t *sq) {
    __m256 x[4];
    for (int i = 0; i < 4; i++) {
        if (bf16) {
            __m128i r = _mm_loadu_si128((const __m128i *)((const uint16_t *)xv + b * 32 + 8 * i));
            x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(r), 16));
        } else {
            x[i] = _mm256_loadu_ps((const float *)xv + b * 32 + 8 * i);
        }
    }
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) /* max(a, m) keeps m where a is NaN, as `a > amax ? a : amax` */
        m = _mm256_max_ps(_mm256_and_ps(x[i], abs_mask), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    float dd = amax / 32767.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i hi = _mm256_set1_epi32(32767), lo = _mm256_set1_epi32(-32767);
    __m256i v[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(x[i], vid),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(r), hi), lo);
        sum = _mm256_add_epi32(sum, v[i]);
    }
    /* int32 -> int16 (in range: no saturation), back in element order */
    __m256i q0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xd8);
    __m256i q1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2], v[3]), 0xd8);
    _mm256_storeu_si256((__m256i *)(q + b * 32), q0);
    _mm256_storeu_si256((__m256i *)(q + b * 32 + 16), q1);
    const __m256i low8 = _mm256_set1_epi16(255);
    __m256i hb = _mm256_packs_epi16(_mm256_srai_epi16(q0, 8), _mm256_srai_epi16(q1, 8));
    __m256i lb = _mm256_packus_epi16(_mm256_and_si256(q0, low8), _mm256_and_si256(q1, low8));
    _mm256_storeu_si256((__m256i *)(h + b * 32), _mm256_permute4x64_epi64(hb, 0xd8));
    _mm256_storeu_si256((__m256i *)(l + b * 32), _mm256_permute4x64_epi64(lb, 0xd8));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    int total = _mm_cvtsi128_si32(s4);
    d[b] = dd;
    s[b] = dd * (float)total;
    sq[b] = total;
}
#endif

static void quantize_row(const void *xv, int bf16, int64_t n, int16_t *q, float *d, float *s,
                         int8_t *h, uint8_t *l, int32_t *sq) {
    for (int64_t b = 0; b < n / 32; b++) {
#ifdef Q_AVX2
        quantize_block_v(xv, bf16, b, q, d, s, h, l, sq);
        continue;
#endif
        float x[32], amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            x[j] = bf16 ? bf16f((const uint8_t *)((const uint16_t *)xv + b * 32 + j))
                        : ((const float *)xv)[b * 32 + j];
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 32767.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(x[j] * id);
            v = v > 32767 ? 32767 : (v < -32767 ? -32767 : v);
            q[b * 32 + j] = (int16_t)v;
            h[b * 32 + j] = (int8_t)(v >> 8); /* v = 256 h + l, l in 0..255 */
            l[b * 32 + j] = (uint8_t)(v & 255);
            sum += v;
        }
        d[b] = dd;
        s[b] = dd * (float)sum;
        sq[b] = sum;
    }
}

/* a weight block as 32 signed int8 values and its scale d and minimum m (0: none) */
Q_INLINE void unpack_p(const int t, const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = h2f(b);
    *m = 0.0f;
    switch (t) {
    case T_Q4_0:
        for (int j = 0; j < 16; j++) {
            w[j] = (int8_t)((b[2 + j] & 15) - 8);
            w[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
        }
        return;
    case T_Q4_1:
        *m = h2f(b + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = (int8_t)(b[4 + j] & 15);
            w[j + 16] = (int8_t)(b[4 + j] >> 4);
        }
        return;
    case T_Q5_0: case T_Q5_1: {
        int o = t == T_Q5_0 ? 2 : 4, off = t == T_Q5_0 ? 16 : 0;
        if (t == T_Q5_1) *m = h2f(b + 2);
        uint32_t qh = le32(b + o);
        for (int j = 0; j < 16; j++) {
            w[j] = (int8_t)(((b[o + 4 + j] & 15) | (((qh >> j) & 1) << 4)) - off);
            w[j + 16] = (int8_t)(((b[o + 4 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
        }
        return;
    }
    case T_Q8_0:
        memcpy(w, b + 2, 32);
        return;
    }
}

#ifdef Q_AVX2
/* f2bf of 8 floats, as 32-bit lanes holding the 16 bits */
static inline __m256i f2bf_v(__m256i u) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quieted, nan);
}

/* bf2f(f2bf(x)) of 8 floats */
static inline __m256 round_bf16_v(__m256 x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(f2bf_v(_mm256_castps_si256(x)), 16));
}
#endif

/* f2bf of n floats (NaN: quiet, as f2bf; else round to nearest even) */
static void f2bf_row(const float *x, int64_t n, uint16_t *out) {
    int64_t j = 0;
#ifdef Q_AVX2
    for (; j + 16 <= n; j += 16) {
        __m256i r[2];
        for (int i = 0; i < 2; i++)
            r[i] = f2bf_v(_mm256_loadu_si256((const __m256i *)(x + j + 8 * i)));
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(out + j), p);
    }
#endif
    for (; j < n; j++) out[j] = f2bf(x[j]);
}

/* the lane-sum tree both builds share: (l_i + l_{i+4}), then (0 + 2) + (1 + 3) */
static inline float lanes_sum(const float *l) {
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    return (a0 + a2) + (a1 + a3);
}

/* the 16 lanes' sum, one fixed tree: l_j + l_{j+8}, then lanes_sum */
static inline float lanes16_sum(const float *l) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = l[j] + l[j + 8];
    return lanes_sum(t);
}

#ifdef Q_AVX2
Q_INLINE __m256i unpack_v(const int t, const uint8_t *b, float *d, float *m) {
    *d = h2f(b);
    *m = 0.0f;
    const __m128i low4 = _mm_set1_epi8(15);
    switch (t) {
    case T_Q4_0: case T_Q4_1: {
        int o = t == T_Q4_0 ? 2 : 4;
        if (t == T_Q4_1) *m = h2f(b + 2);
        __m128i raw = _mm_loadu_si128((const __m128i *)(b + o));
        __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        __m256i v = _mm256_set_m128i(hi, lo);
        return t == T_Q4_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(8)) : v;
    }
    case T_Q5_0: case T_Q5_1: {
        int o = t == T_Q5_0 ? 2 : 4;
        if (t == T_Q5_1) *m = h2f(b + 2);
        __m128i raw = _mm_loadu_si128((const __m128i *)(b + o + 4));
        __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        __m256i v = _mm256_set_m128i(hi, lo);
        /* bit j of qh -> 0x10 in byte j: byte j reads qh's byte j/8, tests bit j%8 */
        __m256i qh = _mm256_set1_epi32((int)le32(b + o));
        const __m256i pick = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                               0x0101010101010101LL, 0x0000000000000000LL);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i by = _mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit);
        __m256i h5 = _mm256_and_si256(_mm256_cmpeq_epi8(by, bit), _mm256_set1_epi8(16));
        v = _mm256_or_si256(v, h5);
        return t == T_Q5_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(16)) : v;
    }
    default: /* T_Q8_0 */
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    }
}

#endif

/* One block's products into a float accumulator of 16 lanes: lane j gets the int32 sum
   w[2j] x[2j] + w[2j + 1] x[2j + 1] times the block's scale, fused-multiply-added. */
#if defined(Q_AVX512)
typedef __m512 qacc;
Q_INLINE qacc acc_zero(void) { return _mm512_setzero_ps(); }
Q_INLINE qacc acc_block(qacc acc, __m256i w, const int16_t *xp, float sc) {
    __m512i w16 = _mm512_cvtepi8_epi16(w), x16 = _mm512_loadu_si512(xp);
#ifdef __AVX512VNNI__
    __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w16, x16);
#else
    __m512i p = _mm512_madd_epi16(w16, x16);
#endif
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(sc), acc);
}
/* lanes16_sum(a + b) in registers: the same adds in the same order */
Q_INLINE float acc_sum(qacc a, qacc b) {
    __m512 v = _mm512_add_ps(a, b);
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 t = _mm256_add_ps(lo, hi);                                           /* l_j + l_j+8 */
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); /* t_j + t_j+4 */
    __m128 r = _mm_add_ps(q, _mm_movehl_ps(q, q));                      /* q0 + q2, q1 + q3 */
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}
#elif defined(Q_AVX2)
typedef struct { __m256 lo, hi; } qacc; /* lanes 0-7 (elements 0-15), 8-15 (16-31) */
Q_INLINE qacc acc_zero(void) { qacc a = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return a; }
Q_INLINE qacc acc_block(qacc acc, __m256i w, const int16_t *xp, float sc) {
    __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
    __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
    __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xp));
    __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xp + 16)));
    __m256 s = _mm256_set1_ps(sc);
    acc.lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), s, acc.lo);
    acc.hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), s, acc.hi);
    return acc;
}
Q_INLINE float acc_sum(qacc a, qacc b) {
    float l[16];
    _mm256_storeu_ps(l, _mm256_add_ps(a.lo, b.lo));
    _mm256_storeu_ps(l + 8, _mm256_add_ps(a.hi, b.hi));
    return lanes16_sum(l);
}
#else
typedef struct { float v[16]; } qacc;
Q_INLINE qacc acc_zero(void) { qacc a; memset(&a, 0, sizeof a); return a; }
Q_INLINE qacc acc_block(qacc acc, const int8_t *w, const int16_t *x, float sc) {
    for (int j = 0; j < 16; j++) {
        int32_t p = w[2 * j] * x[2 * j] + w[2 * j + 1] * x[2 * j + 1];
        acc.v[j] = fmaf((float)p, sc, acc.v[j]);
    }
    return acc;
}
Q_INLINE float acc_sum(qacc a, qacc b) {
    float l[16];
    for (int j = 0; j < 16; j++) l[j] = a.v[j] + b.v[j];
    return lanes16_sum(l);
}
#endif

/* y[m * ldy + r] for weight row r (at wr) and input rows m0 .. m0 + MT: the integer path.
   Even and odd blocks go to two accumulators (and two sums of the minimum terms), so two
   dependency chains are in flight; they are added at the end. The portable build walks the
   same blocks into the same lanes in the same order. */
Q_INLINE void int_tile(const int t, const int MT, const uint8_t *wr, int64_t nb,
                       const int16_t *xq, const float *xd, const float *xs, int64_t m0,
                       float *y, int64_t ldy, int64_t r) {
    const int bytes = q_bytes(t), has_min = t == T_Q4_1 || t == T_Q5_1;
    float mins[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    qacc a[2][4];
    for (int i = 0; i < MT; i++) a[0][i] = a[1][i] = acc_zero();
    for (int64_t k = 0; k < nb; k += 2) {
        int two = k + 1 < nb ? 2 : 1;
        for (int h = 0; h < two; h++) { /* unrolled: h is 0 or 1 */
            float d, mn;
#ifdef Q_AVX2
            __m256i wv = unpack_v(t, wr + (k + h) * bytes, &d, &mn);
#else
            int8_t wv[32];
            unpack_p(t, wr + (k + h) * bytes, wv, &d, &mn);
#endif
            for (int i = 0; i < MT; i++) {
                int64_t at = (m0 + i) * nb + k + h;
                a[h][i] = acc_block(a[h][i], wv, xq + at * 32, d * xd[at]);
                if (has_min) mins[h][i] += mn * xs[at];
            }
        }
    }
    for (int i = 0; i < MT; i++)
        y[(m0 + i) * ldy + r] = acc_sum(a[0][i], a[1][i]) + (mins[0][i] + mins[1][i]);
}

#ifdef Q_AVX2
/* int_tile for one input row and two weight rows (r, r + 1) at once: the same arithmetic per
   row as int_tile, two rows' independent chains interleaved (a matrix-vector product) */
Q_INLINE void int_pair(const int t, const uint8_t *wr, int64_t row_bytes, int64_t nb,
                       const int16_t *xq, const float *xd, const float *xs, float *y,
                       int64_t r) {
    const int bytes = q_bytes(t), has_min = t == T_Q4_1 || t == T_Q5_1;
    float mins[2][2] = {{0, 0}, {0, 0}};
    qacc a[2][2] = {{acc_zero(), acc_zero()}, {acc_zero(), acc_zero()}};
    for (int64_t k = 0; k < nb; k += 2) {
        int two = k + 1 < nb ? 2 : 1;
        for (int h = 0; h < two; h++) {
            const int16_t *xp = xq + (k + h) * 32;
            float sx = xd[k + h];
            for (int q = 0; q < 2; q++) {
                float d, mn;
                __m256i wv = unpack_v(t, wr + q * row_bytes + (k + h) * bytes, &d, &mn);
                a[q][h] = acc_block(a[q][h], wv, xp, d * sx);
                if (has_min) mins[q][h] += mn * xs[k + h];
            }
        }
    }
    for (int q = 0; q < 2; q++) y[r + q] = acc_sum(a[q][0], a[q][1]) + (mins[q][0] + mins[q][1]);
}
#endif

static void k_rows(int t, const uint8_t *w, int64_t row_bytes, int64_t cols, const int16_t *xq,
                   const float *xd, const float *xs, int64_t rows, float *y, int64_t ldy,
                   int64_t r0, int64_t r1); /* unpack-once products (below) */

/* weight rows [r0, r1) against every input row: one row in pairs of weight rows (AVX2), several
   through k_rows */
Q_INLINE void int_rows_of(const int t, const uint8_t *w, int64_t row_bytes, int64_t cols,
                          const int16_t *xq, const float *xd, const float *xs, int64_t rows,
                          float *y, int64_t ldy, int64_t r0, int64_t r1) {
    int64_t nb = cols / 32;
#ifdef Q_AVX2
    if (rows == 1) { /* one input row: weight rows two at a time */
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2) int_pair(t, w + r * row_bytes, row_bytes, nb, xq, xd, xs, y, r);
        if (r < r1) int_tile(t, 1, w + r * row_bytes, nb, xq, xd, xs, 0, y, ldy, r);
        return;
    }
#endif
    if (rows > 1) { /* each weight row unpacked once for every input row: the same bits */
        k_rows(t, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * row_bytes;
        int64_t m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4) int_tile(t, 4, wr, nb, xq, xd, xs, m0, y, ldy, r);
        for (; m0 < rows; m0++) int_tile(t, 1, wr, nb, xq, xd, xs, m0, y, ldy, r);
    }
}

/* int_rows_of with the type a constant in each copy (the unpacking's switch folds away) */
static void int_rows(int t, const uint8_t *w, int64_t row_bytes, int64_t cols,
                     const int16_t *xq, const float *xd, const float *xs, int64_t rows,
                     float *y, int64_t ldy, int64_t r0, int64_t r1) {
    switch (t) {
    case T_Q4_0: int_rows_of(T_Q4_0, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1); break;
    case T_Q4_1: int_rows_of(T_Q4_1, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1); break;
    case T_Q5_0: int_rows_of(T_Q5_0, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1); break;
    case T_Q5_1: int_rows_of(T_Q5_1, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1); break;
    case T_Q8_0: int_rows_of(T_Q8_0, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1); break;
    case T_Q4_K: case T_Q5_K: case T_Q6_K:
        k_rows(t, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1);
        break;
    }
}

/* ---- the integer path for the K-quants: Q4_K, Q5_K, Q6_K ------------------------------------ */

/* A weight row is unpacked once, for every input row, into int16 values with each sub-block's
   scale folded in (Q4_K / Q5_K: sc * q, Q6_K: sc * (q - 32): exact, |w| <= 4096), and per
   32-element block its float scale (the super-block's d) and minimum term (Q4_K / Q5_K:
   -dmin * m, exact in float; Q6_K: 0). Against the int16 input blocks this is the 32-element
   formats' arithmetic: a block's lanes are exact int32 sums w[2j] x[2j] + w[2j+1] x[2j+1]
   (the pair sum stays under 2^29), fused-multiply-added as `fma(sum, d * d_x, acc)` in 16
   lanes, even and odd blocks apart, the minimum terms as `mins += m * s_x`. So the SIMD and
   portable builds give the same bits, and a row's result does not depend on the batch. */

/* the K-quant super-block at b (256 values) -> w16 [256], wd [8], wm [8] */
static void k_unpack(const int t, const uint8_t *b, int16_t *w16, float *wd, float *wm) {
    if (t == T_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        for (int j = 0; j < 8; j++) { /* block j: elements 32 j .. 32 j + 31 */
            int c = j / 4, p = j % 4; /* half c of the super-block, quarter p of it */
            const uint8_t *lo = ql + c * 64 + (p % 2) * 32, *hi = qh + c * 32;
            wd[j] = d;
            wm[j] = 0.0f;
#ifdef Q_AVX2
            const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
            __m256i l = _mm256_and_si256(
                _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)lo),
                                 _mm_cvtsi32_si128(4 * (p / 2))), low4);
            __m256i h = _mm256_and_si256(
                _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)hi),
                                 _mm_cvtsi32_si128(2 * p)), low2);
            __m256i v = _mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 4)),
                                        _mm256_set1_epi8(32));
            __m256i w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                            _mm256_set1_epi16(sc[2 * j]));
            __m256i w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                            _mm256_set1_epi16(sc[2 * j + 1]));
            _mm256_storeu_si256((__m256i *)(w16 + 32 * j), w0);
            _mm256_storeu_si256((__m256i *)(w16 + 32 * j + 16), w1);
#else
            for (int e = 0; e < 32; e++) {
                int q = ((lo[e] >> (4 * (p / 2))) & 15) | (((hi[e] >> (2 * p)) & 3) << 4);
                w16[32 * j + e] = (int16_t)(sc[2 * j + e / 16] * (q - 32));
            }
#endif
        }
        return;
    }
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc6 = b + 4, *qh = b + 16, *qs = b + (t == T_Q4_K ? 16 : 48);
    for (int i = 0; i < 8; i++) { /* sub-block i: the low (even i) or high nibbles of 32 bytes */
        int sc, m;
        k_scale_min(sc6, i, &sc, &m);
        const uint8_t *q = qs + (i / 2) * 32;
        wd[i] = d;
        wm[i] = -(dmin * (float)m);
#ifdef Q_AVX2
        const __m256i low4 = _mm256_set1_epi8(15);
        __m256i v = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)q),
                             _mm_cvtsi32_si128(4 * (i & 1))), low4);
        if (t == T_Q5_K) { /* bit i of qh[l] -> 16 */
            __m256i h = _mm256_and_si256(
                _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(i)),
                _mm256_set1_epi8(1));
            v = _mm256_or_si256(v, _mm256_slli_epi16(h, 4));
        }
        __m256i s = _mm256_set1_epi16((int16_t)sc);
        __m256i w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), s);
        __m256i w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)), s);
        _mm256_storeu_si256((__m256i *)(w16 + 32 * i), w0);
        _mm256_storeu_si256((__m256i *)(w16 + 32 * i + 16), w1);
#else
        for (int l = 0; l < 32; l++) {
            int v = (i & 1) ? (q[l] >> 4) : (q[l] & 15);
            if (t == T_Q5_K) v |= ((qh[l] >> i) & 1) << 4;
            w16[32 * i + l] = (int16_t)(sc * v);
        }
#endif
    }
}

/* acc_block for int16 weights (32 at w) */
#if defined(Q_AVX512)
Q_INLINE qacc acc_block16(qacc acc, const int16_t *w, const int16_t *xp, float sc) {
    __m512i w16 = _mm512_loadu_si512(w), x16 = _mm512_loadu_si512(xp);
#ifdef __AVX512VNNI__
    __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w16, x16);
#else
    __m512i p = _mm512_madd_epi16(w16, x16);
#endif
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(sc), acc);
}
#elif defined(Q_AVX2)
Q_INLINE qacc acc_block16(qacc acc, const int16_t *w, const int16_t *xp, float sc) {
    __m256i p0 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)w),
                                   _mm256_loadu_si256((const __m256i *)xp));
    __m256i p1 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(w + 16)),
                                   _mm256_loadu_si256((const __m256i *)(xp + 16)));
    __m256 s = _mm256_set1_ps(sc);
    acc.lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), s, acc.lo);
    acc.hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), s, acc.hi);
    return acc;
}
#else
Q_INLINE qacc acc_block16(qacc acc, const int16_t *w, const int16_t *x, float sc) {
    for (int j = 0; j < 16; j++) {
        int32_t p = w[2 * j] * x[2 * j] + w[2 * j + 1] * x[2 * j + 1];
        acc.v[j] = fmaf((float)p, sc, acc.v[j]);
    }
    return acc;
}
#endif

/* weight row wr (cols values of type t) -> w16 [cols], wd [cols / 32], wm [cols / 32]: the
   K-quants by k_unpack, the 32-element formats as unpack_v / unpack_p leave each block (the
   int8 values widened, d and the minimum m as int_tile takes them) */
Q_INLINE void row_unpack(const int t, const uint8_t *wr, int64_t cols, int16_t *w16, float *wd,
                         float *wm) {
    const int bytes = q_bytes(t);
    if (t == T_Q4_K || t == T_Q5_K || t == T_Q6_K) {
        for (int64_t s = 0; s < cols / 256; s++)
            k_unpack(t, wr + s * bytes, w16 + 256 * s, wd + 8 * s, wm + 8 * s);
        return;
    }
    for (int64_t k = 0; k < cols / 32; k++) {
#ifdef Q_AVX2
        __m256i v = unpack_v(t, wr + k * bytes, wd + k, wm + k);
        _mm256_storeu_si256((__m256i *)(w16 + 32 * k),
                            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
        _mm256_storeu_si256((__m256i *)(w16 + 32 * k + 16),
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
#else
        int8_t v[32];
        unpack_p(t, wr + k * bytes, v, wd + k, wm + k);
        for (int j = 0; j < 32; j++) w16[32 * k + j] = v[j];
#endif
    }
}

/* y[m * ldy + r] for input rows m0 .. m0 + MT against one unpacked weight row (int_tile's
   arithmetic on k_unpack's values) */
Q_INLINE void k_tile(const int MT, const int has_min, const int16_t *w16, const float *wd,
                     const float *wm, int64_t nb, const int16_t *xq, const float *xd,
                     const float *xs, int64_t m0, float *y, int64_t ldy, int64_t r) {
    float mins[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    qacc a[2][4];
    for (int i = 0; i < MT; i++) a[0][i] = a[1][i] = acc_zero();
    for (int64_t k = 0; k < nb; k += 2) {
        int two = k + 1 < nb ? 2 : 1;
        for (int h = 0; h < two; h++) {
            for (int i = 0; i < MT; i++) {
                int64_t at = (m0 + i) * nb + k + h;
                a[h][i] = acc_block16(a[h][i], w16 + (k + h) * 32, xq + at * 32,
                                      wd[k + h] * xd[at]);
                if (has_min) mins[h][i] += wm[k + h] * xs[at];
            }
        }
    }
    for (int i = 0; i < MT; i++)
        y[(m0 + i) * ldy + r] = acc_sum(a[0][i], a[1][i]) + (mins[0][i] + mins[1][i]);
}

/* weight rows [r0, r1) against every input row: each weight row unpacked once (into a
   buffer of cols int16 and cols / 16 floats), then 4 input rows per pass over it */
Q_INLINE void k_rows_of(const int t, const uint8_t *w, int64_t row_bytes, int64_t cols,
                        const int16_t *xq, const float *xd, const float *xs, int64_t rows,
                        float *y, int64_t ldy, int64_t r0, int64_t r1, int16_t *w16) {
    const int has_min = t == T_Q4_K || t == T_Q5_K || t == T_Q4_1 || t == T_Q5_1;
    int64_t nb = cols / 32;
    float *wd = (float *)(w16 + cols), *wm = wd + nb;
    for (int64_t r = r0; r < r1; r++) {
        row_unpack(t, w + r * row_bytes, cols, w16, wd, wm);
        int64_t m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4)
            k_tile(4, has_min, w16, wd, wm, nb, xq, xd, xs, m0, y, ldy, r);
        for (; m0 < rows; m0++) k_tile(1, has_min, w16, wd, wm, nb, xq, xd, xs, m0, y, ldy, r);
    }
}

#define K_STACK_COLS 8192 /* rows this long unpack on the stack (32 KB); longer ones in the heap */

static void k_rows(int t, const uint8_t *w, int64_t row_bytes, int64_t cols, const int16_t *xq,
                   const float *xd, const float *xs, int64_t rows, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    _Alignas(64) int16_t local[K_STACK_COLS * 2]; /* cols int16 + cols / 16 floats */
    int16_t *w16 = local;
    if (cols > K_STACK_COLS) {
        w16 = malloc((size_t)cols * 4);
        if (!w16) { /* no memory for the unpacked row: NaN out, never a wrong number */
            for (int64_t m = 0; m < rows; m++)
                for (int64_t r = r0; r < r1; r++) y[m * ldy + r] = NAN;
            return;
        }
    }
#define K_ROWS_OF(T) k_rows_of(T, w, row_bytes, cols, xq, xd, xs, rows, y, ldy, r0, r1, w16)
    switch (t) {
    case T_Q4_0: K_ROWS_OF(T_Q4_0); break;
    case T_Q4_1: K_ROWS_OF(T_Q4_1); break;
    case T_Q5_0: K_ROWS_OF(T_Q5_0); break;
    case T_Q5_1: K_ROWS_OF(T_Q5_1); break;
    case T_Q8_0: K_ROWS_OF(T_Q8_0); break;
    case T_Q4_K: K_ROWS_OF(T_Q4_K); break;
    case T_Q5_K: K_ROWS_OF(T_Q5_K); break;
    case T_Q6_K: K_ROWS_OF(T_Q6_K); break;
    }
#undef K_ROWS_OF
    if (w16 != local) free(w16);
}

/* ---- packed weights: Q4_0, Q4_1, Q8_0 in groups of 8 rows ------------------------------- */

/* A packed matrix keeps its stored bytes, rearranged per group of 8 rows (rows / 8 groups;
   the rows % 8 tail rows stay as stored, after the groups). Group g, block k (all 8 rows'
   block k, one after another in memory, so a pass over a group streams it):
     Q4_0: [d of rows 0..7: 8 fp16][qs: 4 x 32 bytes]          (8 x 18 bytes)
     Q4_1: [d: 8 fp16][m: 8 fp16][qs: 4 x 32 bytes]            (8 x 20 bytes)
     Q8_0: [d: 8 fp16][qs: 16 x 16 bytes]                      (8 x 34 bytes)
   Q4 qs part c (0..3), bytes 4r..4r+3 = row r's stored qs bytes 4c..4c+3 (low nibbles:
   elements 4c.., high nibbles: elements 16 + 4c..). Q8_0 qs part c (0..15), bytes 2r, 2r+1 =
   row r's elements 2c, 2c+1. So one 32-bit lane holds one row and a vector holds 8 rows. */

static int pk_type(int t) { return t == T_Q4_0 || t == T_Q4_1 || t == T_Q8_0; }

static int pk_head(int t) { return t == T_Q4_1 ? 32 : 16; } /* scale bytes of a group block */

/* byte i of row r's stored block -> its offset in the packed group block */
static int pk_offset(int t, int r, int i) {
    int head = pk_head(t);
    if (t == T_Q8_0) {
        if (i < 2) return 2 * r + i;
        int e = i - 2;
        return head + (e / 2) * 16 + 2 * r + e % 2;
    }
    int sc = t == T_Q4_1 ? 4 : 2; /* bytes of d (and m) in the stored block */
    if (i < sc) return (i / 2) * 16 + 2 * r + i % 2;
    int e = i - sc;
    return head + (e / 4) * 32 + 4 * r + e % 4;
}

/* row r, block k's bytes as stored (a pointer into w, or rebuilt into tmp when packed) */
static const uint8_t *pk_block(int t, int packed, const uint8_t *w, int64_t row_bytes,
                               int64_t rows, int64_t r, int64_t k, uint8_t *tmp) {
    int nb = q_bytes(t);
    if (!packed || !pk_type(t) || r >= rows / 8 * 8) return w + r * row_bytes + k * nb;
    const uint8_t *gb = w + (r / 8) * 8 * row_bytes + k * 8 * nb;
    int i = (int)(r % 8), head = pk_head(t);
    memcpy(tmp, gb + 2 * i, 2); /* d */
    if (t == T_Q8_0) {
        for (int c = 0; c < 16; c++) memcpy(tmp + 2 + 2 * c, gb + head + 16 * c + 2 * i, 2);
        return tmp;
    }
    int sc = 2;
    if (t == T_Q4_1) {
        memcpy(tmp + 2, gb + 16 + 2 * i, 2); /* m */
        sc = 4;
    }
    for (int c = 0; c < 4; c++) memcpy(tmp + sc + 4 * c, gb + head + 32 * c + 4 * i, 4);
    return tmp;
}

/* stored -> packed (pack 1) or packed -> stored (pack 0), src and dst [rows][row_bytes] */
int q_repack(int t, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t cols,
             int pack, uint8_t *dst) {
    if (!pk_type(t)) return -1;
    int nb = q_bytes(t);
    int64_t blocks = cols / 32, grouped = rows / 8 * 8;
    for (int64_t r = 0; r < grouped; r++)
        for (int64_t k = 0; k < blocks; k++) {
            int64_t flat = r * row_bytes + k * nb, group = (r / 8) * 8 * row_bytes + k * 8 * nb;
            for (int i = 0; i < nb; i++) {
                int64_t o = group + pk_offset(t, (int)(r % 8), i);
                if (pack) dst[o] = src[flat + i];
                else dst[flat + i] = src[o];
            }
        }
    memcpy(dst + grouped * row_bytes, src + grouped * row_bytes, (rows - grouped) * row_bytes);
    return 0;
}

/* One weight row against one input row, in the packed kernels' arithmetic: per block the exact
   integer sum S = sum w q (Q4_0: w = u - 8, as S_u - 8 sum q), then acc = fma(S, d_w d_x, acc)
   block after block, and for Q4_1 mins = fma(m, s_x, mins); the result acc + mins. The SIMD
   kernel does exactly this in 8 lanes (one a row). */
static float pk_row(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t rows,
                    int64_t r, int64_t nb, const int16_t *xq, const float *xd, const float *xs,
                    const int32_t *xsq) {
    float acc = 0.0f, mins = 0.0f;
    uint8_t tmp[34];
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = pk_block(t, packed, w, row_bytes, rows, r, k, tmp);
        const int16_t *q = xq + k * 32;
        int32_t s = 0;
        if (t == T_Q8_0) {
            for (int j = 0; j < 32; j++) s += (int8_t)b[2 + j] * q[j];
        } else {
            const uint8_t *qs = b + (t == T_Q4_1 ? 4 : 2);
            for (int j = 0; j < 16; j++) s += (qs[j] & 15) * q[j] + (qs[j] >> 4) * q[j + 16];
            if (t == T_Q4_0) s -= 8 * xsq[k];
        }
        acc = fmaf((float)s, h2f(b) * xd[k], acc);
        if (t == T_Q4_1) mins = fmaf(h2f(b + 2), xs[k], mins);
    }
    return acc + mins;
}

#ifdef Q_AVX2
#define PK_AHEAD 1024
/* 8 weight rows (group at gp) against one input row: y[0..7] */
Q_INLINE void pk_group(const int t, const uint8_t *gp, int64_t nb, const int16_t *xq,
                       const int8_t *xh, const uint8_t *xl, const float *xd, const float *xs,
                       const int32_t *xsq, float *y) {
    const int gbytes = 8 * q_bytes(t), head = pk_head(t);
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = gp + k * gbytes;
        /* the stream PK_AHEAD bytes on (this group's later blocks, then the next group's: a
           thread's groups are one contiguous run) requested now, so that a one-row product
           (bandwidth-bound) keeps more loads from memory in flight */
        for (int o = 0; o < gbytes; o += 64)
            _mm_prefetch((const char *)b + PK_AHEAD + o, _MM_HINT_T0);
        __m256i s;
        if (t == T_Q8_0) {
            const int16_t *q = xq + k * 32;
            __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
            for (int c = 0; c < 16; c += 2) {
                int32_t x0, x1;
                memcpy(&x0, q + 2 * c, 4);
                memcpy(&x1, q + 2 * c + 2, 4);
                const __m128i *wp = (const __m128i *)(b + head + 16 * c);
                __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp));
                __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp + 1));
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(w0, _mm256_set1_epi32(x0)));
                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(w1, _mm256_set1_epi32(x1)));
            }
            s = _mm256_add_epi32(s0, s1);
        } else {
            /* q = 256 h + l (h signed, l unsigned bytes): S_u = 256 (u . h) + u . l, each
               part in 16-bit sums that cannot overflow (u <= 15: 8 x 2 x 15 x 128 and
               4 x 2 x 15 x 255 < 32768) */
            const int8_t *h = xh + k * 32;
            const uint8_t *l = xl + k * 32;
            __m256i hs = _mm256_setzero_si256(), l0 = hs, l1 = hs;
            for (int c = 0; c < 4; c++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)(b + head + 32 * c));
                __m256i u0 = _mm256_and_si256(p, low);
                __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                int32_t h0, h1, v0, v1;
                memcpy(&h0, h + 4 * c, 4);
                memcpy(&h1, h + 16 + 4 * c, 4);
                memcpy(&v0, l + 4 * c, 4);
                memcpy(&v1, l + 16 + 4 * c, 4);
                hs = _mm256_add_epi16(hs, _mm256_maddubs_epi16(u0, _mm256_set1_epi32(h0)));
                hs = _mm256_add_epi16(hs, _mm256_maddubs_epi16(u1, _mm256_set1_epi32(h1)));
                l0 = _mm256_add_epi16(l0, _mm256_maddubs_epi16(_mm256_set1_epi32(v0), u0));
                l1 = _mm256_add_epi16(l1, _mm256_maddubs_epi16(_mm256_set1_epi32(v1), u1));
            }
            s = _mm256_slli_epi32(_mm256_madd_epi16(hs, ones), 8);
            s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(l0, ones),
                                                     _mm256_madd_epi16(l1, ones)));
            if (t == T_Q4_0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xsq[k]));
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xd[k])), acc);
        if (t == T_Q4_1) {
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)));
            mins = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[k]), mins);
        }
    }
    _mm256_storeu_ps(y, _mm256_add_ps(acc, mins));
}
#endif

struct pk_x { /* one product's quantized inputs, rows * cols / 32 blocks */
    const int16_t *q;
    const int8_t *h;
    const uint8_t *l;
    const float *d, *s;
    const int32_t *sq;
};

#ifdef Q_AVX2
#define PK_MROWS 16 /* input rows that share one unpacking of a group's blocks */
/* from this many input rows Q4_0 / Q4_1 take two groups at once (pk_q4_rows_vnni16; fewer rows
   stream the weights from memory faster one group at a time: 2 rows ~1.5x slower two at a time,
   4 even, 6 and more ~0.78x the time, measured on Qwen3-0.6B's matrices) */
#define PK_WIDE_ROWS 6

/* pk_group for input rows m0 .. m0 + mt - 1 (mt <= PK_MROWS) at once: each block of the group
   is unpacked once for all of them (Q4: the nibbles; Q8_0: the int16 widening), then each row
   does exactly pk_group's arithmetic (the same integer sums, the same float operations in the
   same order: the same bits as one row alone). */
Q_INLINE void pk_group_rows(const int t, const uint8_t *gp, int64_t nb, const struct pk_x *x,
                            int64_t cols, int64_t m0, int64_t mt, float *y, int64_t ldy,
                            int64_t r) {
    const int gbytes = 8 * q_bytes(t), head = pk_head(t);
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[PK_MROWS], mins[PK_MROWS];
    for (int64_t i = 0; i < mt; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = gp + k * gbytes;
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        __m256 mw = t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)))
                                : _mm256_setzero_ps();
        __m256i wv[16]; /* Q4: u0 of part c in wv[c], u1 in wv[4 + c]; Q8_0: part c widened */
        if (t == T_Q8_0) {
            for (int c = 0; c < 16; c++)
                wv[c] = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(b + head + 16 * c)));
        } else {
            for (int c = 0; c < 4; c++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)(b + head + 32 * c));
                wv[c] = _mm256_and_si256(p, low);
                wv[4 + c] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            }
        }
        for (int64_t i = 0; i < mt; i++) {
            int64_t m = m0 + i, o = m * cols + k * 32, ob = m * (cols / 32) + k;
            __m256i s;
            if (t == T_Q8_0) {
                const int16_t *q = x->q + o;
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                for (int c = 0; c < 16; c += 2) {
                    int32_t x0, x1;
                    memcpy(&x0, q + 2 * c, 4);
                    memcpy(&x1, q + 2 * c + 2, 4);
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(wv[c], _mm256_set1_epi32(x0)));
                    s1 = _mm256_add_epi32(s1,
                                          _mm256_madd_epi16(wv[c + 1], _mm256_set1_epi32(x1)));
                }
                s = _mm256_add_epi32(s0, s1);
            } else {
                const int8_t *h = x->h + o;
                const uint8_t *l = x->l + o;
                __m256i hs = _mm256_setzero_si256(), l0 = hs, l1 = hs;
                for (int c = 0; c < 4; c++) {
                    int32_t h0, h1, v0, v1;
                    memcpy(&h0, h + 4 * c, 4);
                    memcpy(&h1, h + 16 + 4 * c, 4);
                    memcpy(&v0, l + 4 * c, 4);
                    memcpy(&v1, l + 16 + 4 * c, 4);
                    __m256i bh0 = _mm256_set1_epi32(h0), bh1 = _mm256_set1_epi32(h1);
                    __m256i bl0 = _mm256_set1_epi32(v0), bl1 = _mm256_set1_epi32(v1);
                    hs = _mm256_add_epi16(hs, _mm256_maddubs_epi16(wv[c], bh0));
                    hs = _mm256_add_epi16(hs, _mm256_maddubs_epi16(wv[4 + c], bh1));
                    l0 = _mm256_add_epi16(l0, _mm256_maddubs_epi16(bl0, wv[c]));
                    l1 = _mm256_add_epi16(l1, _mm256_maddubs_epi16(bl1, wv[4 + c]));
                }
                s = _mm256_slli_epi32(_mm256_madd_epi16(hs, ones), 8);
                s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(l0, ones),
                                                         _mm256_madd_epi16(l1, ones)));
                if (t == T_Q4_0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * x->sq[ob]));
            }
            __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[ob]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc[i]);
            if (t == T_Q4_1) mins[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->s[ob]), mins[i]);
        }
    }
    for (int64_t i = 0; i < mt; i++)
        _mm256_storeu_ps(y + (m0 + i) * ldy + r, _mm256_add_ps(acc[i], mins[i]));
}
#endif

#include "pk_q8_vnni.h" /* Q8_0 groups against several input rows with AVX-512 VNNI */
#include "pk_q4_vnni.h" /* Q4_0 / Q4_1 groups against several input rows with VNNI */

/* weight rows [r0, r1) (r0 a multiple of 8) of a packed matrix against every input row */
Q_INLINE void pk_rows_of(const int t, const uint8_t *w, int64_t row_bytes, int64_t rows,
                         int64_t cols, const struct pk_x *x, int64_t m_rows, float *y,
                         int64_t ldy, int64_t r0, int64_t r1) {
    int64_t nb = cols / 32, r = r0;
#ifdef Q_AVX2
    float out[8];
    for (; r + 8 <= r1 && r + 8 <= rows / 8 * 8; r += 8) {
#ifdef PK_Q4_VNNI16
        if (m_rows >= PK_WIDE_ROWS && t != T_Q8_0 && r + 16 <= r1 && r + 16 <= rows / 8 * 8) {
            for (int64_t m0 = 0; m0 < m_rows; m0 += PK_MROWS) /* two groups at once */
                pk_q4_rows_vnni16(t, w + r * row_bytes, w + (r + 8) * row_bytes, nb, x, cols, m0,
                                  m_rows - m0 < PK_MROWS ? m_rows - m0 : PK_MROWS, y, ldy, r);
            r += 8; /* and the loop's 8 */
            continue;
        }
#endif
        if (m_rows > 1) { /* the group's blocks unpacked once for up to PK_MROWS rows */
            for (int64_t m0 = 0; m0 < m_rows; m0 += PK_MROWS)
#ifdef PK_Q8_VNNI
                if (t == T_Q8_0)
                    pk_q8_rows_vnni(w + r * row_bytes, nb, x, cols, m0,
                                    m_rows - m0 < PK_MROWS ? m_rows - m0 : PK_MROWS, y, ldy, r);
                else
#endif
#ifdef PK_Q4_VNNI
                if (t != T_Q8_0)
                    pk_q4_rows_vnni(t, w + r * row_bytes, nb, x, cols, m0,
                                    m_rows - m0 < PK_MROWS ? m_rows - m0 : PK_MROWS, y, ldy, r);
                else
#endif
                pk_group_rows(t, w + r * row_bytes, nb, x, cols, m0,
                              m_rows - m0 < PK_MROWS ? m_rows - m0 : PK_MROWS, y, ldy, r);
            continue;
        }
        pk_group(t, w + r * row_bytes, nb, x->q, x->h, x->l, x->d, x->s, x->sq, out);
        memcpy(y + r, out, sizeof out);
    }
#endif
    for (; r < r1; r++)
        for (int64_t m = 0; m < m_rows; m++)
            y[m * ldy + r] = pk_row(t, 1, w, row_bytes, rows, r, nb, x->q + m * cols,
                                    x->d + m * nb, x->s + m * nb, x->sq + m * nb);
}

static void pk_rows(int t, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t cols,
                    const struct pk_x *x, int64_t m_rows, float *y, int64_t ldy, int64_t r0,
                    int64_t r1) {
    switch (t) {
    case T_Q4_0: pk_rows_of(T_Q4_0, w, row_bytes, rows, cols, x, m_rows, y, ldy, r0, r1); break;
    case T_Q4_1: pk_rows_of(T_Q4_1, w, row_bytes, rows, cols, x, m_rows, y, ldy, r0, r1); break;
    case T_Q8_0: pk_rows_of(T_Q8_0, w, row_bytes, rows, cols, x, m_rows, y, ldy, r0, r1); break;
    }
}

/* rows [r0, r1) of w [rows][row_bytes] (type t, `packed` as q_repack leaves it, `cols` values a
   row) -> out [r1 - r0][cols] float32; returns 0, or -1 for a type this code does not know */
static int dequant_rows(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t rows,
                        int64_t cols, int64_t r0, int64_t r1, float *out) {
    int bs = q_block(t);
    uint8_t tmp[34];
    if (!bs) return -1;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < cols / bs; k++)
            dequant_block(t, pk_block(t, packed, w, row_bytes, rows, r, k, tmp),
                          out + (r - r0) * cols + k * bs);
    return 0;
}

struct dq_job {
    int t, packed;
    const uint8_t *w;
    int64_t row_bytes, rows, cols;
    float *out;
};

static void dq_part(void *p, int part, int parts) { /* whole groups of 8 rows a part */
    const struct dq_job *j = p;
    int64_t groups = j->rows / 8;
    int64_t r0 = groups * part / parts * 8;
    int64_t r1 = part + 1 == parts ? j->rows : groups * (part + 1) / parts * 8;
    if (r0 < r1)
        dequant_rows(j->t, j->packed, j->w, j->row_bytes, j->rows, j->cols, r0, r1,
                     j->out + r0 * j->cols);
}

/* every row to float32, each value as gguf's numpy reference computes it (split over the
   pool's threads; each value's arithmetic is the same whichever thread computes it) */
int q_dequant(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t cols,
              float *out) {
    if (!q_block(t)) return -1;
    struct dq_job j = {t, packed, w, row_bytes, rows, cols, out};
    int parts = rows * cols < MIN_PARALLEL || rows < 16 ? 1 : pool_threads();
    pool_run(dq_part, &j, parts);
    return 0;
}

/* ---- the fused-dequantization path: any type, float32 inputs ---------------------------- */

static void float_rows(int t, const uint8_t *w, int64_t row_bytes, int64_t cols,
                       const float *x, int64_t rows, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    int bs = q_block(t), bytes = q_bytes(t);
    int chunk = bs < 32 ? 32 : bs; /* elements dequantized at once (cols % chunk == 0) */
    float buf[256];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * row_bytes;
        for (int64_t m0 = 0; m0 < rows; m0 += 4) {
            int mt = rows - m0 < 4 ? (int)(rows - m0) : 4;
            float acc[4][8] = {{0}};
            for (int64_t k = 0; k < cols; k += chunk) {
                for (int e = 0; e < chunk; e += bs)
                    dequant_block(t, wr + (k + e) / bs * bytes, buf + e);
                for (int i = 0; i < mt; i++) {
                    const float *xr = x + (m0 + i) * cols + k;
                    for (int e = 0; e < chunk; e += 8)
                        for (int j = 0; j < 8; j++)
                            acc[i][j] = fmaf(buf[e + j], xr[e + j], acc[i][j]);
                }
            }
            for (int i = 0; i < mt; i++) y[(m0 + i) * ldy + r] = lanes_sum(acc[i]);
        }
    }
}

/* ---- the product, split over the pool's threads ----------------------------------------- */

struct q_job {
    int t, use_int, packed;
    const uint8_t *w;
    int64_t row_bytes, cols, out, rows, ldy;
    const int16_t *xq;
    const float *xd, *xs, *xf;
    float *y;
    struct pk_x x;
};

static void q_part(void *p, int part, int parts) {
    const struct q_job *j = p;
    int64_t r0 = j->out * part / parts, r1 = j->out * (part + 1) / parts;
    if (j->packed) { /* whole groups of 8 rows a part (the tail rows with the last part) */
        int64_t groups = j->out / 8;
        r0 = groups * part / parts * 8;
        r1 = part + 1 == parts ? j->out : groups * (part + 1) / parts * 8;
    }
    if (r0 >= r1) return;
    if (j->packed)
        pk_rows(j->t, j->w, j->row_bytes, j->out, j->cols, &j->x, j->rows, j->y, j->ldy, r0, r1);
    else if (j->use_int)
        int_rows(j->t, j->w, j->row_bytes, j->cols, j->xq, j->xd, j->xs, j->rows, j->y, j->ldy,
                 r0, r1);
    else
        float_rows(j->t, j->w, j->row_bytes, j->cols, j->xf, j->rows, j->y, j->ldy, r0, r1);
}

/* ---- SwiGLU on the product's input --------------------------------------------------------- */

/* exp(x) for x in [-87, 88] (clamped there), Cephes' single-precision method: x = n ln2 + r,
   a degree-5 polynomial for e^r, times 2^n; within ~1 ulp (torch's own vectorised exp is a
   1-ulp one as well). The SIMD copy below does the same operations in the same order. */
static inline float exp_poly(float x) {
    float t = fminf(fmaxf(x, -87.0f), 88.0f);
    float n = nearbyintf(t * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, t);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float e = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return e * scale;
}

#ifdef Q_AVX2
static inline __m256 exp_poly8(__m256 x) {
    __m256 t = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), t);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r,
                               _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}
#endif

/* the gate's activation (q_matmul's `swiglu`): 1 SiLU, 2 GELU with the tanh approximation */
#define GATE_SILU 1
#define GATE_GELU_TANH 2
#define GELU_BETA 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_KAPPA 0.044715f

/* act [rows][cols] = act(gate) * up of x [rows][2 cols] (each row gate | up), as torch's
   `F.silu(gate) * up` / `F.gelu(gate, approximate="tanh") * up` rounds it: SiLU(g) =
   g / (1 + exp(-g)) in float; GELU-tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g +
   0.044715 g^3), computed as the same g / (1 + exp(-2u)) (equal in exact arithmetic; within a
   few ulps of torch's tanh form in float); for bf16 rounded after the activation and after the
   product */
static void swiglu_rows(const void *x, int x_bf16, int64_t rows, int64_t cols, float *act,
                        int gate) {
    for (int64_t m = 0; m < rows; m++) {
        float *a = act + m * cols;
        const uint16_t *xb = (const uint16_t *)x + m * 2 * cols;
        const float *xf = (const float *)x + m * 2 * cols;
        for (int64_t j = 0; j < cols; j++) a[j] = x_bf16 ? bf2f(xb[j]) : xf[j];
        int64_t j = 0;
#ifdef Q_AVX2
        for (; j + 8 <= cols; j += 8) {
            __m256 g = _mm256_loadu_ps(a + j), z = g;
            if (gate == GATE_GELU_TANH) {
                __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
                __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_BETA),
                                         _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA),
                                                                        cube)));
                z = _mm256_add_ps(u, u);
            }
            __m256 e = exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), z));
            _mm256_storeu_ps(a + j, _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
        }
#endif
        for (; j < cols; j++) {
            float g = a[j], z = g;
            if (gate == GATE_GELU_TANH) {
                float u = GELU_BETA * (g + GELU_KAPPA * ((g * g) * g));
                z = u + u;
            }
            a[j] = g / (1.0f + exp_poly(-z));
        }
        if (x_bf16) {
            j = 0;
#ifdef Q_AVX2
            for (; j + 8 <= cols; j += 8) {
                __m128i up = _mm_loadu_si128((const __m128i *)(xb + cols + j));
                __m256 u = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(up), 16));
                __m256 g = round_bf16_v(_mm256_loadu_ps(a + j));
                _mm256_storeu_ps(a + j, round_bf16_v(_mm256_mul_ps(g, u)));
            }
#endif
            for (; j < cols; j++) a[j] = bf2f(f2bf(bf2f(f2bf(a[j])) * bf2f(xb[cols + j])));
        } else
            for (j = 0; j < cols; j++) a[j] = a[j] * xf[cols + j];
    }
}

/* the pool for other libraries' kernels (fused.py's decode attention): fn(args, part, parts)
   over the threads that run the quantized products */
void q_pool_run(pool_fn fn, void *args, int parts) { pool_run(fn, args, parts); }

/* whether type t takes the integer path */
int q_uses_int(int t) {
    return t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q8_0 ||
           t == T_Q4_K || t == T_Q5_K || t == T_Q6_K;
}

/* scratch bytes q_matmul needs for its inputs (plus rows * out floats for a bf16 output) */
int64_t q_scratch_bytes(int t, int64_t rows, int64_t cols, int x_bf16) {
    int64_t n = rows * cols;
    if (q_uses_int(t)) return 4 * n + 12 * (n / 32); /* int16 q, h and l; d, s, sums a block */
    return x_bf16 ? 4 * n : 0;
}

/* y [rows][ldy] (columns 0 .. out) = x [rows][cols] . w^T for w [out] rows of type t.
   x float32 (or bf16 when x_bf16); `packed`: w as q_repack packs it; y float32, or bf16
   (rounded as torch rounds) when y_bf16. With `swiglu`, x is [rows][2 cols] (gate | up) and
   the product's input is SiLU(gate) * up (swiglu 1) or GELU-tanh(gate) * up (swiglu 2;
   swiglu_rows). scratch: q_scratch_bytes, plus
   rows * out floats when y_bf16, plus rows * cols floats with swiglu.
   `threads`: how many parts (0: the pool's own count). Returns 0, -1 for an unknown type,
   -2 when cols is not a multiple of the block. */
int q_matmul(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t out, int64_t cols,
             const void *x, int x_bf16, int64_t rows, void *y_out, int64_t ldy, int y_bf16,
             void *scratch, int threads, int swiglu) {
    float *y = y_out;
    int64_t ldy_out = ldy, used = q_scratch_bytes(t, rows, cols, x_bf16);
    if (y_bf16) { /* the product in float32 after the scratch's inputs, then rounded */
        y = (float *)((uint8_t *)scratch + used);
        ldy = out;
        used += 4 * rows * out;
    }
    int bs = q_block(t);
    if (!bs) return -1;
    if (cols % (bs < 32 ? 32 : bs)) return -2;
    if (packed && !pk_type(t)) return -1;
    if (swiglu) { /* the activated input in float32 (bf16 values exactly) */
        float *act = (float *)((uint8_t *)scratch + used);
        swiglu_rows(x, x_bf16, rows, cols, act, swiglu);
        x = act;
        x_bf16 = 0;
    }
    struct q_job j = {t, q_uses_int(t), packed, w, row_bytes, cols, out, rows, ldy,
                      0, 0, 0, (const float *)x, y, {0}};
    if (j.use_int) {
        int64_t n = rows * cols, nb = n / 32;
        int16_t *q = scratch;
        float *d = (float *)(q + n), *s = d + nb;
        int32_t *sq = (int32_t *)(s + nb);
        int8_t *h = (int8_t *)(sq + nb);
        uint8_t *l = (uint8_t *)(h + n);
        for (int64_t m = 0; m < rows; m++)
            quantize_row(x_bf16 ? (const void *)((const uint16_t *)x + m * cols)
                                : (const void *)((const float *)x + m * cols),
                         x_bf16, cols, q + m * cols, d + m * cols / 32, s + m * cols / 32,
                         h + m * cols, l + m * cols, sq + m * cols / 32);
        j.xq = q;
        j.xd = d;
        j.xs = s;
        struct pk_x px = {q, h, l, d, s, sq};
        j.x = px;
    } else if (x_bf16) {
        float *xf = scratch;
        for (int64_t i = 0; i < rows * cols; i++)
            xf[i] = bf16f((const uint8_t *)((const uint16_t *)x + i));
        j.xf = xf;
    }
    int parts = threads > 0 ? threads : (out * cols < MIN_PARALLEL ? 1 : pool_threads());
    if (packed && parts > out / 8) parts = out / 8 > 0 ? (int)(out / 8) : 1;
    pool_run(q_part, &j, parts);
    if (y_bf16)
        for (int64_t m = 0; m < rows; m++)
            f2bf_row(y + m * out, out, (uint16_t *)y_out + m * ldy_out);
    return 0;
}

/* ---- a decode step's layers in one call ---------------------------------------------------- */

/* the other library's kernels the chain calls (fused.py's: add_rms_norm and rope_decode of the
   model's dtype), by address */
typedef void (*chain_norm_fn)(void *hidden, const void *delta, const void *bias, const void *w,
                              void *out, int64_t n, int64_t h, float eps);
typedef void (*chain_attn_fn)(const void *step, const void *qkv, int64_t row, void *k_pool,
                              void *v_pool, float scale, void *out);

struct q_proj { /* q_matmul's leading arguments for one weight */
    int64_t t, packed;
    const uint8_t *w;
    int64_t row_bytes, out, cols;
};

/* A layer's own half, run in place of the built-in one (MoE experts, MLA attention...):
   `fn(ctx, x, rows, out, bf16, scratch, step)` reads the normed x [rows][hidden] and writes
   out [rows][hidden] (what is then added into h: the attention's output projected by o, or
   the MLP's down output), both of the model's dtype (bf16 != 0: bfloat16, else float32);
   `scratch` is the chain's (at least the bytes the hook asked for at this row count). The
   attention hook writes the step's K/V or latents itself. Returns 0, or an error code the
   chain returns. */
struct q_chain_hook_step {
    /* the layer's rope_decode arguments (attention.c's struct rope_decode_step: positions,
       slots, page table, lengths, sizes), or NULL where the step was given none */
    const void *rope_step;
    void *k_pool, *v_pool; /* the layer's pools as the chain was given them (or NULL) */
    int64_t layer, hidden; /* the layer's index in the chain, the hidden size */
};
typedef int (*chain_half_fn)(const void *ctx, const void *x, int64_t rows, void *out, int bf16,
                             void *scratch, const struct q_chain_hook_step *step);

struct q_chain_layer {
    struct q_proj qkv, o, gate_up, down; /* out 0 where the half is a hook */
    const void *norm1, *norm2; /* the input and post-attention (pre-MLP) RMSNorm weights */
    void *k_pool, *v_pool;
    float scale;
    /* a family's extras, NULL where it has none: each query and key head's RMSNorm weights
       (before the rotary), the norms of the attention's and the MLP's outputs (sandwich),
       and this layer's own rope_decode arguments (its rotary tables, pages, window) */
    const void *q_norm, *k_norm, *post_attn, *post_mlp, *step;
    /* a qkv or gate | up of parts in different formats (a Q4_K_M file's v): the further
       parts (out 0: none), each into the columns after the one before; *_row: all the parts'
       outputs */
    struct q_proj qkv_rest[2], gate_up_rest[2];
    int64_t qkv_row, gate_up_row;
    /* hooks (NULL: the built-in half): attention (norm1's x -> o's output) and MLP (norm2's
       x -> down's output), with their contexts */
    chain_half_fn attn_half, mlp_half;
    const void *attn_ctx, *mlp_ctx;
    /* biases (NULL: none): qkv's and gate | up's float32, added to the float32 products
       before they are rounded to the model's dtype (as quant.py's linear adds them); o's and
       down's of the model's dtype, added with the residual (the norm's bias argument) */
    const float *qkv_bias, *gate_up_bias;
    const void *o_bias, *down_bias;
};

/* y [n][row] = x W for a product of up to three parts (p, then rest's), of q_matmul; y of
   the model's dtype (bf16), or float32 (y_bf16 0) */
static int chain_product(const struct q_proj *p, const struct q_proj *rest, int64_t row,
                         const void *x, int64_t n, void *y, int bf16, int y_bf16, void *scratch) {
    int64_t col = 0;
    for (int k = 0; k < 3; k++, p = rest + k - 1) {
        if (!p->out) break;
        int rc = q_matmul((int)p->t, (int)p->packed, p->w, p->row_bytes, p->out, p->cols, x, bf16,
                          n, (uint8_t *)y + col * (y_bf16 ? 2 : 4), row, y_bf16, scratch, 0, 0);
        if (rc) return rc;
        col += p->out;
    }
    return 0;
}

/* chain_product plus a float32 bias (NULL: none) added to the float32 product, then rounded to
   the model's dtype (`wide`: float32 [n][row] room for a bf16 model's product) */
static int chain_biased(const struct q_proj *p, const struct q_proj *rest, int64_t row,
                        const void *x, int64_t n, void *y, int bf16, void *scratch,
                        const float *bias, float *wide) {
    if (!bias) return chain_product(p, rest, row, x, n, y, bf16, bf16, scratch);
    float *f = bf16 ? wide : (float *)y;
    int rc = chain_product(p, rest, row, x, n, f, bf16, 0, scratch);
    if (rc) return rc;
    for (int64_t m = 0; m < n; m++) {
        float *r = f + m * row;
        for (int64_t j = 0; j < row; j++) r[j] += bias[j];
        if (bf16) f2bf_row(r, row, (uint16_t *)y + m * row);
    }
    return 0;
}

struct q_chain {
    int64_t layers, rows, hidden, bf16; /* bf16: the model's dtype (else float32) */
    float eps;
    chain_norm_fn norm;
    chain_attn_fn attn;
    const void *attn_step;              /* rope_decode's per-step arguments */
    const struct q_chain_layer *layer;
    /* [rows][...] buffers: h (the residual stream, updated in place), x (a norm's output),
       qkv, att (attention's output), o, gu (gate | up), down (the MLP's output) */
    void *h, *x, *qkv, *att, *o, *gu, *down, *scratch;
    /* the family: the head norms' kernel (NULL: no head norms), sandwich norms (`norm` is
       then fused.py's offset_add_rms_norm: the added output normed by the weight in the bias
       argument), the gate's activation (q_matmul's `swiglu`: 1 SiLU, 2 GELU-tanh), and the
       query / kv heads and head size */
    chain_norm_fn head_norm;
    int64_t sandwich, act, hq, hkv, d;
    float *wide; /* float32 [rows][the widest biased qkv or gate | up] (NULL: no such bias) */
};

/* q and k heads of each row of qkv [n][row] normed in place (their RMSNorm, `head_norm`) */
static void chain_head_norms(const struct q_chain *c, const struct q_chain_layer *L,
                             int64_t row) {
    int64_t size = c->bf16 ? 2 : 4, d = c->d;
    for (int64_t r = 0; r < c->rows; r++) {
        uint8_t *q = (uint8_t *)c->qkv + r * row * size, *k = q + c->hq * d * size;
        c->head_norm(q, NULL, NULL, L->q_norm, q, c->hq, d, c->eps);
        c->head_norm(k, NULL, NULL, L->k_norm, k, c->hkv, d, c->eps);
    }
}

/* Every layer of a decode-only step of a decoder, as the Python forward runs
   it (the same kernels on the same inputs in the same order, so the same bits):
     x = add_norm(h, down_prev, norm1); qkv = x W_qkv; att = rope_decode(qkv);
     o = att W_o; x = add_norm(h, o, norm2); gu = x W_gate_up; down = act(gu) W_down,
   with the family's extras where set: q / k head norms before rope_decode, a layer's own
   rope_decode arguments, sandwich norms (the added o and down normed first: `norm` is then
   offset_add_rms_norm, whose bias argument is the added output's norm weight), a layer's
   hooks in place of its attention half (x -> o) or MLP half (x -> down), biases (qkv's and
   gate | up's on the float32 products; o's and down's with the residual add; not with
   sandwich norms, whose norms take the bias argument).
   The caller adds the last layer's `down` (plus its down bias; sandwich: normed by its
   post_mlp) into h. Returns 0, or q_matmul's (or a hook's) error code. */
int q_decode_chain(const struct q_chain *c) {
    int64_t n = c->rows;
    int y_bf16 = (int)c->bf16, rc;
    for (int64_t i = 0; i < c->layers; i++) {
        const struct q_chain_layer *L = c->layer + i;
        const struct q_proj *p;
        const void *added = !i ? NULL : c->sandwich ? L[-1].post_mlp : L[-1].down_bias;
        c->norm(c->h, i ? c->down : NULL, added, L->norm1, c->x, n, c->hidden, c->eps);
        struct q_chain_hook_step hs = {L->step ? L->step : c->attn_step, L->k_pool, L->v_pool,
                                       i, c->hidden};
        if (L->attn_half) {
            rc = L->attn_half(L->attn_ctx, c->x, n, c->o, y_bf16, c->scratch, &hs);
            if (rc) return rc;
        } else {
            int64_t row = L->qkv_row;
            rc = chain_biased(&L->qkv, L->qkv_rest, row, c->x, n, c->qkv, y_bf16, c->scratch,
                              L->qkv_bias, c->wide);
            if (rc) return rc;
            if (L->q_norm) chain_head_norms(c, L, row);
            c->attn(hs.rope_step, c->qkv, row, L->k_pool, L->v_pool, L->scale, c->att);
            p = &L->o;
            rc = q_matmul((int)p->t, (int)p->packed, p->w, p->row_bytes, p->out, p->cols, c->att,
                          y_bf16, n, c->o, p->out, y_bf16, c->scratch, 0, 0);
            if (rc) return rc;
        }
        c->norm(c->h, c->o, c->sandwich ? L->post_attn : L->o_bias, L->norm2, c->x, n,
                c->hidden, c->eps);
        if (L->mlp_half) {
            rc = L->mlp_half(L->mlp_ctx, c->x, n, c->down, y_bf16, c->scratch, &hs);
            if (rc) return rc;
            continue;
        }
        rc = chain_biased(&L->gate_up, L->gate_up_rest, L->gate_up_row, c->x, n, c->gu, y_bf16,
                          c->scratch, L->gate_up_bias, c->wide);
        if (rc) return rc;
        p = &L->down;
        rc = q_matmul((int)p->t, (int)p->packed, p->w, p->row_bytes, p->out, p->cols, c->gu,
                      y_bf16, n, c->down, p->out, y_bf16, c->scratch, 0, (int)c->act);
        if (rc) return rc;
    }
    return 0;
}

/* rows `ids` [n] of the table w (type t, cols values a row) -> out [n][cols] float32 */
int q_embedding(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t rows,
                int64_t cols, const int64_t *ids, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++)
        if (dequant_rows(t, packed, w, row_bytes, rows, cols, ids[i], ids[i] + 1, out + i * cols))
            return -1;
    return 0;
}
