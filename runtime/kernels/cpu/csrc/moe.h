/* The routed-experts MLP of one layer (moe.c): its arguments, as moe.py fills them. */

#ifndef MOE_H
#define MOE_H

#include <stdint.h>

struct moe_proj { /* q_matmul's leading arguments for one weight (out 0: none) */
    int64_t t, packed;
    const uint8_t *w;
    int64_t row_bytes, out, cols;
};

struct moe_mat { /* a weight of up to three parts in different formats, stacked by rows */
    struct moe_proj part[3];
    int64_t row; /* every part's outputs */
};

struct q_moe {
    /* routed experts, the k chosen a token, the model's width, an expert's intermediate size;
       this rank holds experts first .. first + held (expert parallel) */
    int64_t experts, k, hidden, inter, first, held;
    /* routing (moe.py's `route`): sigmoid scores (V3, groups by their two best biased scores)
       or softmax (group_limited: groups by their best score); n_group groups of which
       topk_group are kept; the top-k weights renormalised; all scaled by `scale` */
    int64_t sigmoid, group_limited, n_group, topk_group, norm_topk;
    float scale;
    const float *router; /* [experts][hidden] float32 */
    const float *bias;   /* [experts]: V3's e_score_correction_bias, or NULL */
    const struct moe_mat *gate_up; /* [held]: gate | up, [2 inter][hidden] */
    const struct moe_proj *down;   /* [held]: [hidden][inter] */
    struct moe_mat shared_gate_up; /* the shared experts (row 0: none) */
    struct moe_proj shared_down;
    int64_t *load; /* [experts]: each expert's tokens added (NULL: not counted) */
};

int q_moe(const struct q_moe *m, const void *x, int64_t rows, void *out, int bf16);
int q_moe_route(const struct q_moe *m, const void *x, int64_t rows, int bf16, int64_t *ids,
                float *weights);
int q_moe_half(const void *ctx, const void *x, int64_t rows, void *out, int bf16, void *scratch,
               const void *step);

#endif
