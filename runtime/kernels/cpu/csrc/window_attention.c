/* Causal paged attention with a sliding window and / or a logit soft cap, for query chunks
   (window_attention.h; runtime/kernels/cpu/window.py), built with -ffast-math: float32 and
   bfloat16 instances over a pool of the model's type. */

#include <stdatomic.h>

#include "attention.h"

#define WA_ROWS 8 /* query rows of one chunk per task */

#define STORAGE STORAGE_F32
#define POOL POOL_SAME
#include "instance.h"
#include "window_attention.h"
#include "instance_end.h"

#define STORAGE STORAGE_BF16
#define POOL POOL_SAME
#include "instance.h"
#include "window_attention.h"
#include "instance_end.h"
