/* Several input rows against a packed Q4_0 / Q4_1 group of 8 weight rows with VNNI byte dot
   products (included by quant.c after pk_group_rows, whose arithmetic this is; only where the
   CPU has AVX-512 VL and VNNI, for the 256-bit `vpdpbusd`).

   Why: a speculative verify runs its drafts as decode rows, so the quantized model's products
   take k + 1 input rows, and every row after the first costs pk_group_rows a block's worth of
   16-bit arithmetic: per block and input row 16 `vpmaddubsw`, 16 16-bit adds and 3 `vpmaddwd`
   to widen. `vpdpbusd` multiplies 4 unsigned bytes by 4 signed bytes and adds them into an
   int32 lane in one instruction, which is the same sum without the 16-bit stage: per block
   and row 16 `vpdpbusd` (8 for the input's high bytes h, 8 for its low bytes l) and one
   shift-add.

   The split is pk_group_rows' own: q = 256 h + l (h signed, l unsigned bytes), so a weight
   row's block sum is S_u = 256 (u . h) + u . l with u the 4-bit values 0..15; u . h goes in as
   (unsigned u) x (signed h), u . l as (unsigned l) x (u as signed bytes: 0..15). Both sums are
   exact in int32 (|u . h| <= 32 x 15 x 128, u . l <= 32 x 15 x 255), and so is S_u, whatever
   the order of the additions: the same integer as pk_group_rows'. The float operations are the
   same ones in the same order (acc = fma(float(S), d_w d_x, acc), mins = fma(m_w, s_x, mins)
   block after block, then acc + mins): the same bits as one row alone, as pk_group computes
   it. */

#if defined(Q_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PK_Q4_VNNI 1

Q_INLINE void pk_q4_rows_vnni(const int t, const uint8_t *gp, int64_t nb, const struct pk_x *x,
                              int64_t cols, int64_t m0, int64_t mt, float *y, int64_t ldy,
                              int64_t r) {
    const int gbytes = 8 * q_bytes(t), head = pk_head(t);
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc[PK_MROWS], mins[PK_MROWS];
    for (int64_t i = 0; i < mt; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    const int64_t xb = cols / 32;
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = gp + k * gbytes;
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        __m256 mw = t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)))
                                : _mm256_setzero_ps();
        __m256i u[8]; /* part c's low nibbles (elements 4c..4c+3 of each row) in u[c], its
                         high nibbles (elements 16+4c..) in u[4 + c] */
        for (int c = 0; c < 4; c++) {
            __m256i p = _mm256_loadu_si256((const __m256i *)(b + head + 32 * c));
            u[c] = _mm256_and_si256(p, low);
            u[4 + c] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
        }
        for (int64_t i = 0; i < mt; i++) {
            int64_t m = m0 + i, o = m * cols + k * 32, ob = m * xb + k;
            const int8_t *h = x->h + o;
            const uint8_t *l = x->l + o;
            /* two accumulators each for u . h and u . l (shorter dependency chains) */
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, l0 = h0, l1 = h0;
            for (int c = 0; c < 4; c++) {
                int32_t hv0, hv1, lv0, lv1;
                memcpy(&hv0, h + 4 * c, 4);
                memcpy(&hv1, h + 16 + 4 * c, 4);
                memcpy(&lv0, l + 4 * c, 4);
                memcpy(&lv1, l + 16 + 4 * c, 4);
                h0 = _mm256_dpbusd_epi32(h0, u[c], _mm256_set1_epi32(hv0));
                h1 = _mm256_dpbusd_epi32(h1, u[4 + c], _mm256_set1_epi32(hv1));
                l0 = _mm256_dpbusd_epi32(l0, _mm256_set1_epi32(lv0), u[c]);
                l1 = _mm256_dpbusd_epi32(l1, _mm256_set1_epi32(lv1), u[4 + c]);
            }
            __m256i s = _mm256_slli_epi32(_mm256_add_epi32(h0, h1), 8);
            s = _mm256_add_epi32(s, _mm256_add_epi32(l0, l1));
            if (t == T_Q4_0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * x->sq[ob]));
            __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[ob]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc[i]);
            if (t == T_Q4_1) mins[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->s[ob]), mins[i]);
        }
    }
    for (int64_t i = 0; i < mt; i++)
        _mm256_storeu_ps(y + (m0 + i) * ldy + r, _mm256_add_ps(acc[i], mins[i]));
}
#endif

/* Two groups (16 weight rows) at once in 512-bit registers: group g's 8 rows in the low half of
   each vector, group g + 1's in the high half, so each of an input row's broadcast 4 bytes feeds
   one 512-bit `vpdpbusd` for both groups. Measured on the CPU this was written on (AMD Zen 4), a
   512-bit `vpdpbusd` issues as often as a 256-bit one: half the instructions for the same sums.
   Per weight row (a lane) the integer sums and the float operations are pk_q4_rows_vnni's, in
   the same order: the same bits. */

#if defined(PK_Q4_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PK_Q4_VNNI16 1

Q_INLINE __m512i pk_two(const uint8_t *a, const uint8_t *b) { /* 32 bytes of each, a low */
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

Q_INLINE __m512 pk_two_ph(const uint8_t *a, const uint8_t *b) { /* 8 halves of each, a low */
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
        _mm_loadu_si128((const __m128i *)b), 1));
}

Q_INLINE void pk_q4_rows_vnni16(const int t, const uint8_t *gp, const uint8_t *gp2, int64_t nb,
                                const struct pk_x *x, int64_t cols, int64_t m0, int64_t mt,
                                float *y, int64_t ldy, int64_t r) {
    const int gbytes = 8 * q_bytes(t), head = pk_head(t);
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[PK_MROWS], mins[PK_MROWS];
    for (int64_t i = 0; i < mt; i++) acc[i] = mins[i] = _mm512_setzero_ps();
    const int64_t xb = cols / 32;
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = gp + k * gbytes, *b2 = gp2 + k * gbytes;
        /* both streams PK_AHEAD bytes on (two streams in step are not the one contiguous run
           the hardware prefetcher follows best: with few input rows the weights' loads from
           memory decide) */
        for (int o = 0; o < gbytes; o += 64) {
            _mm_prefetch((const char *)b + PK_AHEAD + o, _MM_HINT_T0);
            _mm_prefetch((const char *)b2 + PK_AHEAD + o, _MM_HINT_T0);
        }
        __m512 dw = pk_two_ph(b, b2);
        __m512 mw = t == T_Q4_1 ? pk_two_ph(b + 16, b2 + 16) : _mm512_setzero_ps();
        __m512i u[8]; /* as pk_q4_rows_vnni's, both groups */
        for (int c = 0; c < 4; c++) {
            __m512i p = pk_two(b + head + 32 * c, b2 + head + 32 * c);
            u[c] = _mm512_and_si512(p, low);
            u[4 + c] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
        }
        for (int64_t i = 0; i < mt; i++) {
            int64_t m = m0 + i, o = m * cols + k * 32, ob = m * xb + k;
            const int8_t *h = x->h + o;
            const uint8_t *l = x->l + o;
            __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0;
            for (int c = 0; c < 4; c++) {
                int32_t hv0, hv1, lv0, lv1;
                memcpy(&hv0, h + 4 * c, 4);
                memcpy(&hv1, h + 16 + 4 * c, 4);
                memcpy(&lv0, l + 4 * c, 4);
                memcpy(&lv1, l + 16 + 4 * c, 4);
                h0 = _mm512_dpbusd_epi32(h0, u[c], _mm512_set1_epi32(hv0));
                h1 = _mm512_dpbusd_epi32(h1, u[4 + c], _mm512_set1_epi32(hv1));
                l0 = _mm512_dpbusd_epi32(l0, _mm512_set1_epi32(lv0), u[c]);
                l1 = _mm512_dpbusd_epi32(l1, _mm512_set1_epi32(lv1), u[4 + c]);
            }
            __m512i s = _mm512_slli_epi32(_mm512_add_epi32(h0, h1), 8);
            s = _mm512_add_epi32(s, _mm512_add_epi32(l0, l1));
            if (t == T_Q4_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * x->sq[ob]));
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[ob]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[i]);
            if (t == T_Q4_1) mins[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->s[ob]), mins[i]);
        }
    }
    for (int64_t i = 0; i < mt; i++)
        _mm512_storeu_ps(y + (m0 + i) * ldy + r, _mm512_add_ps(acc[i], mins[i]));
}
#endif
