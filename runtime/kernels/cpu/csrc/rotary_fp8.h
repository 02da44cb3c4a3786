/* Template (see instance.h), included once per model type and fp8 pool type: rotary with the
   K/V write quantizing into the pool as KVPool.write does. */

/* x (float) as the pool stores it: minus the offset (NULL: none), times the reciprocal scale,
   clamped to the type's range, rounded: the operations and order of KVPool.write */
static inline kv_t FN(quantize)(float x, const float *off, int64_t j, float inv) {
    if (off) x = x - off[j];
    x = x * inv;
    x = x > KVMAX ? KVMAX : (x < -KVMAX ? -KVMAX : x);
    return ENC(x);
}

/* rotary_kv for an fp8 pool: q as there; k (rotated, rounded to scalar_t as there) and v stored
   through FN(quantize) with the layer's offsets [hkv, d] (NULL: none) and reciprocal scales */
void FN(rotary_kv)(const scalar_t *qkv, int64_t row, const scalar_t *cos_t, const scalar_t *sin_t,
                   const int64_t *pos, const int64_t *slots, int64_t n, int64_t hq, int64_t hkv,
                   int64_t d, scalar_t *q_out, kv_t *k_flat, kv_t *v_flat, const float *k_off,
                   const float *v_off, float k_inv, float v_inv) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < n; i++) {
        const scalar_t *src = qkv + i * row;
        const scalar_t *c = cos_t + pos[i] * d, *s = sin_t + pos[i] * d;
        for (int64_t hh = 0; hh < hq + hkv; hh++) {
            const scalar_t *x = src + hh * d;
            scalar_t rot[512];
            scalar_t *dst = hh < hq ? q_out + (i * hq + hh) * d : rot;
            for (int64_t j = 0; j < half; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(-LD(x[j + half]) * LD(s[j])));
            for (int64_t j = half; j < d; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(LD(x[j - half]) * LD(s[j])));
            if (hh < hq) continue;
            int64_t h = hh - hq;
            kv_t *kd = k_flat + (slots[i] * hkv + h) * d;
            const float *off = k_off ? k_off + h * d : NULL;
            for (int64_t j = 0; j < d; j++) kd[j] = FN(quantize)(LD(rot[j]), off, j, k_inv);
        }
        const scalar_t *v = src + (hq + hkv) * d;
        kv_t *vd = v_flat + slots[i] * hkv * d;
        for (int64_t j = 0; j < hkv * d; j++) vd[j] = FN(quantize)(LD(v[j]), v_off, j, v_inv);
    }
}
