#ifndef FP8_H
#define FP8_H

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

#endif
