/* Several input rows against a packed Q8_0 group of 8 weight rows with AVX-512 VNNI (included by
   quant.c after pk_group_rows, whose arithmetic this is; only where the CPU has AVX-512 BW, VL
   and VNNI).

   Why: Gemma 3's LM head is its tied Q8_0 embedding, 262,144 x 640. A decode step of 16 requests
   multiplies it against 16 rows (2.7 G multiply-adds); pk_group_rows spends per block and input
   row 16 broadcasts, 16 `vpmaddwd` and 16 integer adds on 256-bit vectors. Here a block's 8 rows x
   32 elements are 8 registers of 32 int16 (two packed parts each: lanes 0-7 the 8 rows' elements
   4cc, 4cc + 1, lanes 8-15 their elements 4cc + 2, 4cc + 3), and each input row's block is one
   register whose int16 pairs a `vpermd` spreads to those lanes: 8 permutes and 8 `vpdpwssd` a
   block and row.

   Same bits as pk_group_rows: the block's integer sum per weight row is exact in int32 whatever
   the order of its additions (|sum| <= 32 x 128 x 32767 < 2^31), and the float operations are
   the same ones in the same order (acc = fma(float(S), d_w d_x, acc) block after block, then
   acc + 0, the minimum terms Q8_0 does not have). */

#if defined(Q_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PK_Q8_VNNI 1

Q_INLINE void pk_q8_rows_vnni(const uint8_t *gp, int64_t nb, const struct pk_x *x, int64_t cols,
                              int64_t m0, int64_t mt, float *y, int64_t ldy, int64_t r) {
    const int gbytes = 8 * 34, head = 16;
    __m512i idx[8]; /* lanes 0-7: dword 2cc of the input block, lanes 8-15: dword 2cc + 1 */
    for (int cc = 0; cc < 8; cc++)
        idx[cc] = _mm512_inserti64x4(_mm512_set1_epi32(2 * cc), _mm256_set1_epi32(2 * cc + 1), 1);
    __m256 acc[PK_MROWS];
    for (int64_t i = 0; i < mt; i++) acc[i] = _mm256_setzero_ps();
    const int64_t xb = cols / 32;
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *b = gp + k * gbytes;
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        __m512i wv[8];
        for (int cc = 0; cc < 8; cc++)
            wv[cc] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + head + 32 * cc)));
        for (int64_t i = 0; i < mt; i++) {
            int64_t m = m0 + i;
            __m512i xv = _mm512_loadu_si512(x->q + m * cols + k * 32);
            __m512i s = _mm512_setzero_si512();
            for (int cc = 0; cc < 8; cc++)
                s = _mm512_dpwssd_epi32(s, wv[cc], _mm512_permutexvar_epi32(idx[cc], xv));
            __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s),
                                          _mm512_extracti64x4_epi64(s, 1));
            __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[m * xb + k]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), sc, acc[i]);
        }
    }
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < mt; i++)
        _mm256_storeu_ps(y + (m0 + i) * ldy + r, _mm256_add_ps(acc[i], zero));
}
#endif
