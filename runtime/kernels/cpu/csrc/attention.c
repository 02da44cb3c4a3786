/* Decode attention over a pool of the model's type, and a decode step's rotary + attention in
   one call (fused.py's "fast" unit, built with -ffast-math): float32 and bfloat16 instances of
   decode_attention.h and rope_decode.h. */

#include "attention.h"

void set_attention_runner(par_runner runner) { attention_runner = runner; }

/* what stays the same for every layer of a decode-only step (rope_decode; fused.RopeDecode) */
struct rope_decode_step {
    const void *cos, *sin;
    const int64_t *pos, *slots;
    const int32_t *table, *lens;
    int64_t table_stride, n, hq, hkv, d, ps, num_pages;
    void *q;
    int64_t window; /* > 0: attend to each request's last `window` keys only */
    int64_t rot;    /* the rotated values of a head (partial rotary; 0: all d) */
    float cap;      /* > 0: scores soft-capped, cap * tanh(s / cap) */
};

#define STORAGE STORAGE_F32
#define POOL POOL_SAME
#include "instance.h"
#include "decode_attention.h"
#include "rope_decode.h"
#include "instance_end.h"

#define STORAGE STORAGE_BF16
#define POOL POOL_SAME
#include "instance.h"
#include "decode_attention.h"
#include "rope_decode.h"
#include "instance_end.h"
