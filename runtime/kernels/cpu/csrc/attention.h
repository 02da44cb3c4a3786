/* What decode attention's units share: OpenMP, the runner another library's pool may stand in
   for it with, and 16-lane float vectors (GCC >= 12 or clang: HAVE_VECTORS). */

#ifndef ATTENTION_H
#define ATTENTION_H

#include "common.h"

#ifdef _OPENMP
#include <omp.h>
#endif
/* Another library's thread pool that decode attention splits its requests over instead of
   OpenMP (set_attention_runner; NULL: OpenMP): a quantized model's projections run on the
   quantized kernels' pool, whose worker spins between jobs, and an OpenMP team beside it
   would want the same cores. */
typedef void (*par_fn)(void *args, int part, int parts);
typedef void (*par_runner)(par_fn fn, void *args, int parts);
static par_runner attention_runner __attribute__((unused)); /* read in OpenMP builds only */
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

#endif
