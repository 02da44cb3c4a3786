/* Ends an instance begun with instance.h: its names are free for the next one. */

#undef STORAGE
#undef POOL
#undef STORAGE_NAME
#undef scalar_t
#undef LD
#undef RND
#undef ST
#undef FN
#undef kv_t
#undef LDK
#undef LDV_KV
#undef ENC
#undef KVMAX
