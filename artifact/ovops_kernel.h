/* The fused iRPE attention kernel (ovops_kernel.c) as the Python glue (_ovops.c) calls it. */
#ifndef IRPE_OVOPS_KERNEL_H
#define IRPE_OVOPS_KERNEL_H

#include <stdint.h>

#define MAX_TERMS 4
#define WINDOW 64 /* a row whose reads of a lut lie within 64 entries looks them up by register permutes */

/* One call: B * H planes of n tokens, head width d. */
typedef struct {
    const uint16_t *q, *kt, *v; /* bfloat16 (B, H, n, d), (B, H, d, n), (B, H, n, d) */
    void *ctx;                  /* (B, H, n, d), float32 or bfloat16 (ctx_bf16) */
    int ctx_bf16;
    int terms;
    const void *lut[MAX_TERMS]; /* (B, H, L, K), float32 or bfloat16 (lut_bf16) */
    int lut_bf16[MAX_TERMS];
    const int32_t *index[MAX_TERMS]; /* (n * n,): term[i, j] = lut[b, h].flat[index[i * n + j]] */
    int64_t plane[MAX_TERMS];        /* L * K: one (b, h) slice of each lut */
    const int32_t *window[MAX_TERMS]; /* per query row: the first entry it reads when all lie within WINDOW, else -1 */
    /* a lut no row of which is windowed but every key column is (the q side, read at key j): the index
     * transposed and each column's first entry; NULL otherwise */
    const int32_t *index_t[MAX_TERMS], *column[MAX_TERMS];
    float *sums;           /* (n, B * H, kv) or NULL */
    const int32_t *bucket; /* (n * n,) in [-1, kv) */
    /* separable buckets (the product method): bucket[i][skip + r * gw + c] = row bucket * mb + column bucket;
     * ra: per query the key rows [first, end) of each row bucket (-1: a prefix query, no key in a bucket);
     * cb: per query 16 lanes "last column of column bucket b", 16 lanes "last column before it" (-1: none).
     * NULL when the table is not of that form. */
    const int32_t *ra, *cb;
    int64_t skip, gh, gw, mb;
    int64_t kv, bh, n, d;
    int vector; /* 1: the AVX-512 BF16 kernel (d a multiple of 32), 0: the plain C reference */
} Job;

/* Whether this CPU runs the vector kernel (AVX-512 with BF16). */
int ovops_vector_cpu(void);
/* Remember the CPUs the process may use (call once, at import, before anything pins threads). */
void ovops_init_cpus(void);
/* The planes split over `threads` threads; 0 on success, -1 out of memory. */
int ovops_run(const Job *J, int threads);

#endif
