/* Decode attention over an fp8 pool, one instance a unit (fused.py's "fast_<type>_<fp8>" units,
   built with -ffast-math and -DSTORAGE=... -DPOOL=...: one unit's compile stays short). */

#if !defined(STORAGE) || !defined(POOL)
#error "build with -DSTORAGE=STORAGE_F32|STORAGE_BF16 -DPOOL=POOL_E4M3|POOL_E5M2"
#endif

#include "attention.h"
#include "fp8.h"

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

#include "instance.h"
#include "decode_attention.h"
#include "instance_end.h"
