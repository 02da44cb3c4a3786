/* Template (see instance.h), included once per model type: RMSNorm with the residual add, and
   rotary with the K/V write. Each step rounds where torch's op-by-op code rounds (bf16: after
   every op). */

/* hidden[n, h] += delta (+ bias, added to delta first, as `out + bias`); then
   out = w * RND(x * rsqrt(mean(x^2) + eps)) with x = hidden in float. delta may be NULL. */
/* 1 / sqrt(mean(x^2) + eps) of one row, in 16 partial sums (add_rms_norm's and offset_add_rms_norm's) */
static inline float FN(inv_rms)(const scalar_t *x, int64_t h, float eps) {
    float part[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= h; j += 16)
        for (int k = 0; k < 16; k++) part[k] += LD(x[j + k]) * LD(x[j + k]);
    for (; j < h; j++) part[0] += LD(x[j]) * LD(x[j]);
    float sum = 0.0f;
    for (int k = 0; k < 16; k++) sum += part[k];
    return 1.0f / sqrtf(sum / (float)h + eps);
}

void FN(add_rms_norm)(scalar_t *hidden, const scalar_t *delta, const scalar_t *bias,
                      const scalar_t *w, scalar_t *out, int64_t n, int64_t h, float eps) {
    for (int64_t i = 0; i < n; i++) {
        scalar_t *x = hidden + i * h;
        if (delta) {
            const scalar_t *dl = delta + i * h;
            for (int64_t j = 0; j < h; j++) {
                float add = LD(dl[j]);
                if (bias) add = RND(add + LD(bias[j]));
                x[j] = ST(LD(x[j]) + add);
            }
        }
        float r = FN(inv_rms)(x, h, eps);
        scalar_t *o = out + i * h;
        for (int64_t j = 0; j < h; j++) o[j] = ST(LD(w[j]) * RND(LD(x[j]) * r));
    }
}

/* Gemma's norms, whose float32 weights (1 + w) multiply before the rounding to the model type
   (`F.rms_norm(x.float(), (h,), w, eps).to(dtype)`): with delta, hidden += RMSNorm(delta) *
   w_delta in place (the normed delta rounded to the model type first: the sum of two tensors
   of it); then out = RMSNorm(hidden) * w. Rows [n, h], contiguous. */
void FN(offset_add_rms_norm)(scalar_t *hidden, const scalar_t *delta, const float *w_delta,
                             const float *w, scalar_t *out, int64_t n, int64_t h, float eps) {
    for (int64_t i = 0; i < n; i++) {
        scalar_t *x = hidden + i * h;
        if (delta) {
            const scalar_t *dl = delta + i * h;
            float rd = FN(inv_rms)(dl, h, eps);
            for (int64_t j = 0; j < h; j++)
                x[j] = ST(LD(x[j]) + RND((LD(dl[j]) * rd) * w_delta[j]));
        }
        float r = FN(inv_rms)(x, h, eps);
        scalar_t *o = out + i * h;
        for (int64_t j = 0; j < h; j++) o[j] = ST((LD(x[j]) * r) * w[j]);
    }
}

/* qkv [n, row] holds q (hq heads), k (hkv heads), v (hkv heads) of width d per token. Rotates
   the first rd values of each q head into q_out [n, hq, d] and of each k head into
   k_flat[slot] (the other d - rd copied: partial rotary), copies v into v_flat[slot] (flat
   pools [slots, hkv, d]); cos/sin tables [positions, rd]: x * cos + rotate_half(x) * sin. */
void FN(rotary_kv_part)(const scalar_t *qkv, int64_t row, const scalar_t *cos_t,
                        const scalar_t *sin_t, const int64_t *pos, const int64_t *slots,
                        int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t rd,
                        scalar_t *q_out, scalar_t *k_flat, scalar_t *v_flat) {
    int64_t half = rd / 2;
    for (int64_t i = 0; i < n; i++) {
        const scalar_t *src = qkv + i * row;
        const scalar_t *c = cos_t + pos[i] * rd, *s = sin_t + pos[i] * rd;
        for (int64_t hh = 0; hh < hq + hkv; hh++) {
            const scalar_t *x = src + hh * d;
            scalar_t *dst =
                hh < hq ? q_out + (i * hq + hh) * d : k_flat + (slots[i] * hkv + hh - hq) * d;
            for (int64_t j = 0; j < half; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(-LD(x[j + half]) * LD(s[j])));
            for (int64_t j = half; j < rd; j++)
                dst[j] = ST(RND(LD(x[j]) * LD(c[j])) + RND(LD(x[j - half]) * LD(s[j])));
            if (rd < d) memcpy(dst + rd, x + rd, sizeof(scalar_t) * (d - rd));
        }
        memcpy(v_flat + slots[i] * hkv * d, src + (hq + hkv) * d, sizeof(scalar_t) * hkv * d);
    }
}

/* rotary_kv_part of the whole head (rd = d) */
void FN(rotary_kv)(const scalar_t *qkv, int64_t row, const scalar_t *cos_t, const scalar_t *sin_t,
                   const int64_t *pos, const int64_t *slots, int64_t n, int64_t hq, int64_t hkv,
                   int64_t d, scalar_t *q_out, scalar_t *k_flat, scalar_t *v_flat) {
    FN(rotary_kv_part)(qkv, row, cos_t, sin_t, pos, slots, n, hq, hkv, d, d, q_out, k_flat,
                       v_flat);
}
