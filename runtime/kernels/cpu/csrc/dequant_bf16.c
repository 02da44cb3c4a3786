/* Weights of the formats whose rows quant.c's products do not pack (Q5_0, Q5_1, Q4_K, Q5_K,
   Q6_K) to bfloat16 in one pass, for a prefill-sized product of bf16 inputs (quant.py's
   `linear`: the weight dequantized into a reused buffer, then torch's bf16 matmul). Each value
   is computed in float32 exactly as quant.c's q_dequant computes it (the same operations in the
   same order; the unit is built with -ffp-contract=off), then rounded to bfloat16 as torch
   rounds (common.h's f2bf): equal to `q_dequant(...).to(torch.bfloat16)`. Written as loops of
   constant length with the scale fixed in each, so the compiler vectorises them (quant.c's
   per-element Q6_K dequantization took ~20x the time of its Q4_K one). Split over quant.c's
   thread pool (q_pool_run) by rows. */

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { D_Q5_0 = 6, D_Q5_1 = 7, D_Q4_K = 12, D_Q5_K = 13, D_Q6_K = 14 };

void q_pool_run(void (*fn)(void *, int, int), void *args, int parts); /* quant.c */

/* IEEE half to float, exact */
static inline float dq_h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
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

/* float to bfloat16 as common.h's f2bf (round to nearest even, NaN kept quiet), branch-free so
   a loop of them vectorises */
static inline uint16_t dq_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static int dq_block_bytes(int t) {
    switch (t) {
    case D_Q5_0: return 22;
    case D_Q5_1: return 24;
    case D_Q4_K: return 144;
    case D_Q5_K: return 176;
    case D_Q6_K: return 210;
    }
    return 0;
}

static int dq_block_values(int t) { return t == D_Q5_0 || t == D_Q5_1 ? 32 : 256; }

static void dq_q5(int t, const uint8_t *b, uint16_t *out) {
    float d = dq_h2f(b), m = t == D_Q5_1 ? dq_h2f(b + 2) : 0.0f, f[32];
    const uint8_t *qhp = b + (t == D_Q5_1 ? 4 : 2), *qs = qhp + 4;
    uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 |
                  (uint32_t)qhp[3] << 24;
    int q[32];
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    }
    if (t == D_Q5_1)
        for (int j = 0; j < 32; j++) f[j] = d * (float)q[j] + m;
    else
        for (int j = 0; j < 32; j++) f[j] = d * (float)(q[j] - 16);
    for (int j = 0; j < 32; j++) out[j] = dq_f2bf(f[j]);
}

static void dq_k45(int t, const uint8_t *b, uint16_t *out) {
    float d = dq_h2f(b), dmin = dq_h2f(b + 2), f[32];
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (t == D_Q4_K ? 16 : 48);
    for (int i = 0; i < 8; i++) {
        int sc, m;
        if (i < 4) {
            sc = s[i] & 63;
            m = s[i + 4] & 63;
        } else {
            sc = (s[i + 4] & 15) | ((s[i - 4] >> 6) << 4);
            m = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
        }
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = qs + (i / 2) * 32;
        int shift = (i & 1) * 4;
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 15;
            if (t == D_Q5_K) v |= ((qh[l] >> i) & 1) << 4;
            f[l] = ds * (float)v - dm;
        }
        for (int l = 0; l < 32; l++) out[i * 32 + l] = dq_f2bf(f[l]);
    }
}

static void dq_k6(const uint8_t *b, uint16_t *out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = dq_h2f(b + 208), ds[16], f[256];
    for (int i = 0; i < 16; i++) ds[i] = d * (float)sc[i];
    /* value e = c * 128 + s * 32 + l: low 4 bits from ql[c * 64 + (s % 2) * 32 + l] (shifted
       by 4 for s >= 2), high 2 bits from qh[c * 32 + l] (shifted by 2 s); scale ds[e / 16] */
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++) {
            const uint8_t *lo = ql + c * 64 + (s % 2) * 32, *hi = qh + c * 32;
            float *o = f + c * 128 + s * 32;
            float d0 = ds[(c * 128 + s * 32) / 16], d1 = ds[(c * 128 + s * 32) / 16 + 1];
            for (int l = 0; l < 32; l++) {
                int q = ((lo[l] >> (4 * (s / 2))) & 15) | (((hi[l] >> (2 * s)) & 3) << 4);
                o[l] = (l < 16 ? d0 : d1) * (float)(q - 32);
            }
        }
    for (int e = 0; e < 256; e++) out[e] = dq_f2bf(f[e]);
}

struct dq_bf16_job {
    int t;
    const uint8_t *w;
    int64_t row_bytes, rows, cols;
    uint16_t *out;
};

static void dq_bf16_part(void *p, int part, int parts) {
    const struct dq_bf16_job *j = p;
    int64_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts;
    int bytes = dq_block_bytes(j->t), n = dq_block_values(j->t);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < j->cols / n; k++) {
            const uint8_t *b = j->w + r * j->row_bytes + k * bytes;
            uint16_t *o = j->out + r * j->cols + k * n;
            if (j->t == D_Q6_K) dq_k6(b, o);
            else if (j->t == D_Q4_K || j->t == D_Q5_K) dq_k45(j->t, b, o);
            else dq_q5(j->t, b, o);
        }
}

/* rows [rows][row_bytes] of type t (as the file stores them, not repacked) -> out [rows][cols]
   bfloat16; returns 0, or -1 for a type this code does not take */
int q_dequant_bf16(int t, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t cols,
                   uint16_t *out) {
    if (!dq_block_bytes(t) || cols % dq_block_values(t)) return -1;
    struct dq_bf16_job j = {t, w, row_bytes, rows, cols, out};
    int parts = 1;
#ifdef _OPENMP
    if (rows * cols >= 65536) parts = omp_get_max_threads();
#endif
    if (parts > rows) parts = rows > 0 ? (int)rows : 1;
    if (parts > 1) q_pool_run(dq_bf16_part, &j, parts);
    else dq_bf16_part(&j, 0, 1);
    return 0;
}
