/* The names a kernel template (norm_rotary.h, rotary_fp8.h, decode_attention.h, rope_decode.h)
   is written with, for one instance: define STORAGE (STORAGE_F32 or STORAGE_BF16: the model's
   tensors) and POOL (POOL_SAME: the KV pool holds the storage type; POOL_E4M3 / POOL_E5M2: an
   fp8 pool), include this, then the templates, then instance_end.h. A unit of one instance
   takes them as flags instead (-DSTORAGE=STORAGE_BF16 -DPOOL=POOL_E4M3).

   scalar_t / LD(x) / RND(x) / ST(x): the storage type, to float, a float rounded to the storage
   type (kept as float), float to storage. kv_t / LDK(x) / LDV_KV(p): the pool's type, one value
   to float, 16 values to a float vector; ENC(x) / KVMAX: float to fp8, the fp8 type's largest
   value. FN(name): the instance's function name, `name_f32`, `name_bf16_e4m3`, ... */

#define STORAGE_F32 1
#define STORAGE_BF16 2
#define POOL_SAME 0
#define POOL_E4M3 1
#define POOL_E5M2 2

#define INSTANCE_CAT_(a, b) a##_##b
#define INSTANCE_CAT(a, b) INSTANCE_CAT_(a, b)

#if STORAGE == STORAGE_F32
#define STORAGE_NAME f32
#define scalar_t float
#define LD(x) (x)
#define RND(x) (x)
#define ST(x) (x)
#elif STORAGE == STORAGE_BF16
#define STORAGE_NAME bf16
#define scalar_t uint16_t
#define LD(x) bf2f(x)
#define RND(x) bf2f(f2bf(x))
#define ST(x) f2bf(x)
#else
#error "STORAGE must be STORAGE_F32 or STORAGE_BF16"
#endif

#if POOL == POOL_SAME
#define FN(name) INSTANCE_CAT(name, STORAGE_NAME)
#define kv_t scalar_t
#define LDK(x) LD(x)
#define LDV_KV(p) INSTANCE_CAT(ldv, STORAGE_NAME)(p)
#elif POOL == POOL_E4M3
#define FN(name) INSTANCE_CAT(INSTANCE_CAT(name, STORAGE_NAME), e4m3)
#define kv_t uint8_t
#define LDK(x) e4m3_to_f32(x)
#define LDV_KV(p) ldv_e4m3(p)
#define ENC(x) enc_e4m3(x)
#define KVMAX 448.0f
#elif POOL == POOL_E5M2
#define FN(name) INSTANCE_CAT(INSTANCE_CAT(name, STORAGE_NAME), e5m2)
#define kv_t uint8_t
#define LDK(x) e5m2_to_f32(x)
#define LDV_KV(p) ldv_e5m2(p)
#define ENC(x) enc_e5m2(x)
#define KVMAX 57344.0f
#else
#error "POOL must be POOL_SAME, POOL_E4M3 or POOL_E5M2"
#endif
