/* One-row projections (gemv.py's unit, with its layout and numbers): a matrix-vector product over
   weights packed in blocks of 16 rows, split over pool.h's spinning pool; also the one-row
   argmax and the OpenMP team helpers the engine calls. */

#define _POSIX_C_SOURCE 200809L /* clock_gettime (pool.h) under -std=c11 */

#include "pool.h"
#include "common.h" /* bf2f / f2bf: torch's bfloat16 conversions */

#define MIN_PARALLEL 65536 /* weights (elements) below which one thread does it all */

#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef float g16f __attribute__((vector_size(64)));

static inline g16f gld(const float *p) {
    g16f v;
    memcpy(&v, p, sizeof v);
    return v;
}


/* one block of 16 rows (wb, packed [in][16]) times x, float32 */
static inline void block_f32(const float *wb, const float *x, int64_t in, float *y) {
    {
        g16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t k = 0;
        for (; k + 4 <= in; k += 4) {
            a0 += gld(wb + (k + 0) * 16) * x[k + 0];
            a1 += gld(wb + (k + 1) * 16) * x[k + 1];
            a2 += gld(wb + (k + 2) * 16) * x[k + 2];
            a3 += gld(wb + (k + 3) * 16) * x[k + 3];
        }
        for (; k < in; k++) a0 += gld(wb + k * 16) * x[k];
        g16f s = (a0 + a1) + (a2 + a3);
        memcpy(y, &s, sizeof s);
    }
}

/* block_f32 for 4 rows of x (x [4][in], y rows `out` apart): each weight load serves the 4
   rows, each row's partial sums and their order those of block_f32 (the same bits) */
static inline void block4_f32(const float *wb, const float *x, int64_t in, float *y,
                              int64_t out) {
    g16f a[4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 4 <= in; k += 4)
        for (int j = 0; j < 4; j++) {
            g16f w = gld(wb + (k + j) * 16);
            for (int m = 0; m < 4; m++) a[m][j] += w * x[m * in + k + j];
        }
    for (; k < in; k++) {
        g16f w = gld(wb + k * 16);
        for (int m = 0; m < 4; m++) a[m][0] += w * x[m * in + k];
    }
    for (int m = 0; m < 4; m++) {
        g16f s = (a[m][0] + a[m][1]) + (a[m][2] + a[m][3]);
        memcpy(y + m * out, &s, sizeof s);
    }
}

/* blocks [b0, b1) of y = x w^T for `rows` rows of x [rows, in] (y [rows, out]), float32, w
   packed [out/16][in][16]; each row's sums as for one row, the block re-read from cache */
static void gemv_blocks_f32(const float *w, const float *x, float *y, int64_t b0, int64_t b1,
                            int64_t in, int64_t rows, int64_t out) {
    for (int64_t b = b0; b < b1; b++) {
        int64_t m = 0;
        for (; m + 4 <= rows; m += 4)
            block4_f32(w + b * 16 * in, x + m * in, in, y + m * out + b * 16, out);
        for (; m < rows; m++)
            block_f32(w + b * 16 * in, x + m * in, in, y + m * out + b * 16);
    }
}

/* one block of 16 rows (wb, packed [in/2][16][2]) times x, bfloat16, the float32 sums in s */
static inline void block_bf16(const uint16_t *wb, const uint16_t *x, int64_t in, float *s) {
    int64_t kp = in / 2;
    {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
        int32_t x2[4];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 4 <= kp; k += 4) { /* partial sums over k mod 4, as the fallback */
            memcpy(x2, x + 2 * k, sizeof x2);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(wb + (k + 0) * 32),
                                  (__m512bh)_mm512_set1_epi32(x2[0]));
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(wb + (k + 1) * 32),
                                  (__m512bh)_mm512_set1_epi32(x2[1]));
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(wb + (k + 2) * 32),
                                  (__m512bh)_mm512_set1_epi32(x2[2]));
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(wb + (k + 3) * 32),
                                  (__m512bh)_mm512_set1_epi32(x2[3]));
        }
        for (; k < kp; k++) {
            memcpy(x2, x + 2 * k, 4);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(wb + k * 32),
                                  (__m512bh)_mm512_set1_epi32(x2[0]));
        }
        _mm512_storeu_ps(s, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
        g16f acc[4] = {{0}, {0}, {0}, {0}};
        int64_t kp4 = kp / 4 * 4; /* the inputs past it go to the first partial sum */
        for (int64_t k = 0; k < kp; k++) {
            float lo = bf2f(x[2 * k]), hi = bf2f(x[2 * k + 1]), wl[16], wh[16];
            for (int r = 0; r < 16; r++) {
                wl[r] = bf2f(wb[k * 32 + 2 * r]);
                wh[r] = bf2f(wb[k * 32 + 2 * r + 1]);
            }
            /* vdpbf16ps's order: the odd input's product first (products of bf16 are exact) */
            int j = k < kp4 ? (int)(k & 3) : 0;
            acc[j] = (acc[j] + gld(wh) * hi) + gld(wl) * lo;
        }
        g16f t = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        memcpy(s, &t, sizeof t);
#endif
    }
}

/* block_bf16 for 4 rows of x (x [4][in]), the sums in s [4][16]: each weight load serves the
   4 rows, each row's partial sums and their order those of block_bf16 (the same bits) */
static inline void block4_bf16(const uint16_t *wb, const uint16_t *x, int64_t in, float *s) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    int64_t kp = in / 2;
    __m512 a[4][4];
    for (int m = 0; m < 4; m++)
        for (int j = 0; j < 4; j++) a[m][j] = _mm512_setzero_ps();
    int64_t k = 0;
    int32_t x2;
    for (; k + 4 <= kp; k += 4)
        for (int j = 0; j < 4; j++) {
            __m512bh w = (__m512bh)_mm512_loadu_si512(wb + (k + j) * 32);
            for (int m = 0; m < 4; m++) {
                memcpy(&x2, x + m * in + 2 * (k + j), 4);
                a[m][j] = _mm512_dpbf16_ps(a[m][j], w, (__m512bh)_mm512_set1_epi32(x2));
            }
        }
    for (; k < kp; k++) {
        __m512bh w = (__m512bh)_mm512_loadu_si512(wb + k * 32);
        for (int m = 0; m < 4; m++) {
            memcpy(&x2, x + m * in + 2 * k, 4);
            a[m][0] = _mm512_dpbf16_ps(a[m][0], w, (__m512bh)_mm512_set1_epi32(x2));
        }
    }
    for (int m = 0; m < 4; m++)
        _mm512_storeu_ps(s + 16 * m, _mm512_add_ps(_mm512_add_ps(a[m][0], a[m][1]),
                                                   _mm512_add_ps(a[m][2], a[m][3])));
#else
    for (int m = 0; m < 4; m++) block_bf16(wb, x + m * in, in, s + 16 * m);
#endif
}

/* the 16 sums of one block and row, rounded to bf16 (with `wide`, widened back to float32) */
static inline void put_bf16(const float *s, void *y, int64_t at, int wide) {
    for (int r = 0; r < 16; r++) {
        uint16_t h = f2bf(s[r]);
        if (wide) /* the bf16 value, widened to float32 (the LM head's logits) */
            ((float *)y)[at + r] = bf2f(h);
        else
            ((uint16_t *)y)[at + r] = h;
    }
}

/* as gemv_blocks_f32, bfloat16 (w packed [out/16][in/2][16][2]); with `wide`, y float32 */
static void gemv_blocks_bf16(const uint16_t *w, const uint16_t *x, void *y, int64_t b0,
                             int64_t b1, int64_t in, int64_t rows, int64_t out, int wide) {
    float s[64];
    for (int64_t b = b0; b < b1; b++) {
        int64_t m = 0;
        for (; m + 4 <= rows; m += 4) {
            block4_bf16(w + b * 16 * in, x + m * in, in, s);
            for (int i = 0; i < 4; i++) put_bf16(s + 16 * i, y, (m + i) * out + b * 16, wide);
        }
        for (; m < rows; m++) {
            block_bf16(w + b * 16 * in, x + m * in, in, s);
            put_bf16(s, y, m * out + b * 16, wide);
        }
    }
}

struct gemv_job {
    const void *w, *x;
    void *y;
    int64_t blocks, in, rows, out;
    int bf16, wide;
};

static void gemv_part(void *p, int part, int parts) {
    const struct gemv_job *j = p;
    int64_t b0 = j->blocks * part / parts, b1 = j->blocks * (part + 1) / parts;
    if (b0 >= b1) return;
    if (j->bf16)
        gemv_blocks_bf16(j->w, j->x, j->y, b0, b1, j->in, j->rows, j->out, j->wide);
    else
        gemv_blocks_f32(j->w, j->x, j->y, b0, b1, j->in, j->rows, j->out);
}

/* Another library's pool that the products split over instead of this one's (set_gemv_runner;
   NULL: this library's): the one that decode attention runs on too, so that a decode step's
   work has one set of spinning workers, not two pools' beside each other. */
static pool_runner_fn gemv_runner;

void set_gemv_runner(pool_runner_fn runner) { gemv_runner = runner; }

/* this library's pool, for decode attention to split over (fused.run_attention_on) */
void gemv_pool_run(pool_fn fn, void *args, int parts) { pool_run(fn, args, parts); }

static void gemv_run(const void *w, const void *x, void *y, int64_t out, int64_t in,
                     int64_t rows, int bf16, int wide) {
    struct gemv_job j = {w, x, y, out / 16, in, rows, out, bf16, wide};
    int parts = out * in < MIN_PARALLEL ? 1 : pool_threads();
    if (parts > 1 && gemv_runner)
        gemv_runner(gemv_part, &j, parts);
    else
        pool_run(gemv_part, &j, parts);
}

/* y [rows, out] = x [rows, in] w^T, w packed */
void gemv_f32(const float *w, const float *x, float *y, int64_t out, int64_t in, int64_t rows) {
    gemv_run(w, x, y, out, in, rows, 0, 0);
}

void gemv_bf16(const uint16_t *w, const uint16_t *x, uint16_t *y, int64_t out, int64_t in,
               int64_t rows) {
    gemv_run(w, x, y, out, in, rows, 1, 0);
}

/* as gemv_bf16, the bf16 results written widened to float32 */
void gemv_bf16_wide(const uint16_t *w, const uint16_t *x, float *y, int64_t out, int64_t in,
                    int64_t rows) {
    gemv_run(w, x, y, out, in, rows, 1, 1);
}

/* torch's argmax of one float32 row: the first index of the maximum, a NaN counting as the
   maximum (the first NaN wins) */
int64_t argmax_f32(const float *x, int64_t n) {
    float best = x[0];
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        nan |= v != v;
        best = v > best ? v : best;
    }
    for (int64_t i = 0; i < n; i++)
        if (nan ? x[i] != x[i] : x[i] == best) return i;
    return 0;
}

/* Free the calling thread's OpenMP team (OpenMP 5.0; GCC >= 9): 1 if freed or none was
   there, 0 where the runtime cannot. libgomp stops spinning once
   two threads own teams, so the thread that loaded a model lets the one running it keep its
   team spinning. */
int release_openmp_team(void) {
#if defined(_OPENMP) && (_OPENMP >= 201811 || (!defined(__clang__) && __GNUC__ >= 9))
    return omp_pause_resource_all(omp_pause_soft) == 0;
#else
    return 0;
#endif
}

/* Open a parallel region on the calling thread and keep its team (its size; 0 without
   OpenMP). With this thread's team and the scheduler thread's, libgomp manages more threads
   than there are CPUs and its workers spin only briefly (its throttled count) after a region
   before they sleep: right where another pool does the step's main work on the same cores. */
int hold_openmp_team(void) {
    int n = 0;
#ifdef _OPENMP
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
#endif
    return n;
}
