/* Rotary with the K/V write into an fp8 pool (fused.py's "exact8" unit, built with
   -ffp-contract=off): rotary_fp8.h for each model type and fp8 type. */

#include "common.h"
#include "fp8.h"

#define STORAGE STORAGE_F32
#define POOL POOL_E4M3
#include "instance.h"
#include "rotary_fp8.h"
#include "instance_end.h"

#define STORAGE STORAGE_F32
#define POOL POOL_E5M2
#include "instance.h"
#include "rotary_fp8.h"
#include "instance_end.h"

#define STORAGE STORAGE_BF16
#define POOL POOL_E4M3
#include "instance.h"
#include "rotary_fp8.h"
#include "instance_end.h"

#define STORAGE STORAGE_BF16
#define POOL POOL_E5M2
#include "instance.h"
#include "rotary_fp8.h"
#include "instance_end.h"
