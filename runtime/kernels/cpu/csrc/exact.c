/* RMSNorm with the residual add, rotary with the K/V write (fused.py's "exact" unit, built with
   -ffp-contract=off): float32 and bfloat16 instances of norm_rotary.h. */

#include "common.h"

#define STORAGE STORAGE_F32
#define POOL POOL_SAME
#include "instance.h"
#include "norm_rotary.h"
#include "instance_end.h"

#define STORAGE STORAGE_BF16
#define POOL POOL_SAME
#include "instance.h"
#include "norm_rotary.h"
#include "instance_end.h"
