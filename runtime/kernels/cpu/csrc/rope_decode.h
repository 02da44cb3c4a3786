/* Template (see instance.h), included once per model type after decode_attention.h. */

/* A decode-only step's per-layer attention in one call: rotary_kv_part (the exact unit's: q
   into st->q, k and v into the pools at st->slots; the first st->rot values of a head rotated,
   all of it where that is 0), then decode_attention of st->n requests (to
   their last st->window keys where that is > 0; scores soft-capped by st->cap where > 0). */

void FN(rotary_kv_part)(const scalar_t *qkv, int64_t row, const scalar_t *cos_t,
                        const scalar_t *sin_t, const int64_t *pos, const int64_t *slots,
                        int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t rd,
                        scalar_t *q_out, scalar_t *k_flat, scalar_t *v_flat);

void FN(rope_decode)(const struct rope_decode_step *st, const scalar_t *qkv, int64_t row,
                     scalar_t *k_pool, scalar_t *v_pool, float scale, scalar_t *out) {
    FN(rotary_kv_part)(qkv, row, st->cos, st->sin, st->pos, st->slots, st->n, st->hq, st->hkv,
                       st->d, st->rot ? st->rot : st->d, st->q, k_pool, v_pool);
    FN(decode_attention_window)(st->q, k_pool, v_pool, st->table, st->table_stride, st->lens,
                                st->n, st->hq, st->hkv, st->d, st->ps, st->num_pages, scale,
                                st->window, st->cap, out);
}
