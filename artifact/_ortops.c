/* iRPE lookups as ONNX Runtime custom ops (CPU), loaded with SessionOptions.register_custom_ops_library.
 *
 * Domain "irpe.ort", opset 1, float32 tensors, int32 index constants:
 *   LookupAdd(scores[B,H,n,n], lut[B,H,L,K], index[n*n])  -> out = scores + lut[b,h].flat[index]
 *   LookupAdd2 .. LookupAdd4(scores, lut1, index1, lut2, index2, ...): out = scores + (((lut1[b,h].flat[index1]
 *       + lut2[b,h].flat[index2]) + lut3...) + lut4...), the terms summed left to right as the graph does
 *   BucketSumRows(attn[B,H,n,n], index[n,n]; num_buckets=K) -> out[n, B*H, K],
 *       out[i, b*H+h, k] = sum_j [index[i,j] == k] attn[b,h,i,j]   (index -1: the key is left out)
 * The first two are the q/k lookups of contextual iRPE added into the attention scores (Eq. 27-28), one pass
 * that reads the scores and writes the sum; the third is the value side's bucket sums in the query-major
 * layout the graph's (K, d) MatMul reads. artifact/ort_graph.py puts them into the graph ONNX Runtime reads.
 *
 * No ONNX Runtime header is needed (none ships with the wheel): the few ABI facts used are declared here.
 * OrtApi is a table of function pointers that only ever grows; the slots named below are stable since API
 * version 1 (17 for ParallelFor). OrtCustomOp is declared at version 16: CreateKernelV2 / KernelComputeV2,
 * so a bad input comes back to the caller as an error status instead of a crash. Index values are checked
 * against the tensor they read on every call (the artifact is untrusted).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTypeShape OrtTypeShape;
typedef void OrtApiTable; /* OrtApi: read by slot */

typedef struct {
    const OrtApiTable *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

enum { T_FLOAT = 1, T_INT32 = 6 };
enum { E_FAIL = 1, E_INVALID_ARGUMENT = 2 };

/* OrtApi slots (0-based). */
enum {
    S_CREATE_STATUS = 0, S_CREATE_DOMAIN = 26, S_DOMAIN_ADD = 27, S_ADD_DOMAIN = 28, S_MUTABLE_DATA = 51,
    S_DIMS_COUNT = 61, S_DIMS = 62, S_TYPE_SHAPE = 65, S_ATTR_INT64 = 86, S_INPUT = 90, S_OUTPUT = 91,
    S_RELEASE_TYPE_SHAPE = 99, S_PARALLEL_FOR = 274
};

typedef struct OrtCustomOp OrtCustomOp;
struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const OrtCustomOp *, const OrtApiTable *, const OrtKernelInfo *);
    const char *(*GetName)(const OrtCustomOp *);
    const char *(*GetExecutionProviderType)(const OrtCustomOp *);
    int (*GetInputType)(const OrtCustomOp *, size_t);
    size_t (*GetInputTypeCount)(const OrtCustomOp *);
    int (*GetOutputType)(const OrtCustomOp *, size_t);
    size_t (*GetOutputTypeCount)(const OrtCustomOp *);
    void (*KernelCompute)(void *, OrtKernelContext *);
    void (*KernelDestroy)(void *);
    int (*GetInputCharacteristic)(const OrtCustomOp *, size_t);
    int (*GetOutputCharacteristic)(const OrtCustomOp *, size_t);
    int (*GetInputMemoryType)(const OrtCustomOp *, size_t);
    int (*GetVariadicInputMinArity)(const OrtCustomOp *);
    int (*GetVariadicInputHomogeneity)(const OrtCustomOp *);
    int (*GetVariadicOutputMinArity)(const OrtCustomOp *);
    int (*GetVariadicOutputHomogeneity)(const OrtCustomOp *);
    OrtStatus *(*CreateKernelV2)(const OrtCustomOp *, const OrtApiTable *, const OrtKernelInfo *, void **);
    OrtStatus *(*KernelComputeV2)(void *, OrtKernelContext *);
    void *tail[7]; /* later members, unread at version 16 */
};

#define SLOT(api, i) (((void *const *)(api))[i])
typedef OrtStatus *(*create_status_fn)(int, const char *);
typedef OrtStatus *(*create_domain_fn)(const char *, OrtCustomOpDomain **);
typedef OrtStatus *(*domain_add_fn)(OrtCustomOpDomain *, const OrtCustomOp *);
typedef OrtStatus *(*add_domain_fn)(OrtSessionOptions *, OrtCustomOpDomain *);
typedef OrtStatus *(*mutable_data_fn)(const OrtValue *, void **);
typedef OrtStatus *(*dims_count_fn)(const OrtTypeShape *, size_t *);
typedef OrtStatus *(*dims_fn)(const OrtTypeShape *, int64_t *, size_t);
typedef OrtStatus *(*type_shape_fn)(const OrtValue *, OrtTypeShape **);
typedef OrtStatus *(*attr_int64_fn)(const OrtKernelInfo *, const char *, int64_t *);
typedef OrtStatus *(*input_fn)(const OrtKernelContext *, size_t, const OrtValue **);
typedef OrtStatus *(*output_fn)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **);
typedef void (*release_fn)(void *);
typedef OrtStatus *(*parallel_for_fn)(const OrtKernelContext *, void (*)(void *, size_t), size_t, size_t, void *);

static const OrtApiTable *g_api;
static int g_parallel; /* the runtime has KernelContext_ParallelFor (API >= 17) */

#define TRY(call)                      \
    do {                               \
        OrtStatus *status_ = (call);   \
        if (status_) return status_;   \
    } while (0)

static OrtStatus *fail(int code, const char *fmt, long long a, long long b) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    return ((create_status_fn)SLOT(g_api, S_CREATE_STATUS))(code, msg);
}

typedef struct {
    const OrtValue *value;
    float *data;
    int64_t dims[4];
    size_t rank;
} Tensor;

/* Input i of the context: data pointer and shape (rank at most 4). */
static OrtStatus *input(OrtKernelContext *ctx, size_t i, Tensor *t) {
    OrtTypeShape *info = NULL;
    TRY(((input_fn)SLOT(g_api, S_INPUT))(ctx, i, &t->value));
    TRY(((mutable_data_fn)SLOT(g_api, S_MUTABLE_DATA))(t->value, (void **)&t->data));
    TRY(((type_shape_fn)SLOT(g_api, S_TYPE_SHAPE))(t->value, &info));
    OrtStatus *st = ((dims_count_fn)SLOT(g_api, S_DIMS_COUNT))(info, &t->rank);
    if (!st && t->rank > 4) st = fail(E_INVALID_ARGUMENT, "input %lld has rank %lld, at most 4 expected", (long long)i,
                                      (long long)t->rank);
    if (!st) st = ((dims_fn)SLOT(g_api, S_DIMS))(info, t->dims, t->rank);
    ((release_fn)SLOT(g_api, S_RELEASE_TYPE_SHAPE))(info);
    return st;
}

static int64_t numel(const Tensor *t) {
    int64_t count = 1;
    for (size_t d = 0; d < t->rank; d++) count *= t->dims[d];
    return count;
}

/* Every index value in [0, limit): the lookups read lut[index] unchecked after this. */
static OrtStatus *check_index(const int32_t *index, int64_t count, int64_t lo, int64_t limit) {
    int32_t min = 0, max = 0;
    for (int64_t p = 0; p < count; p++) {
        min = index[p] < min ? index[p] : min;
        max = index[p] > max ? index[p] : max;
    }
    if (min < lo || max >= limit)
        return fail(E_INVALID_ARGUMENT, "index values span [%lld, %lld], outside the table read", min, max);
    return NULL;
}

/* Run fn(job, 0..total-1) on ONNX Runtime's intra-op threads (or here, on an older runtime). */
static OrtStatus *parallel(OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total, void *job) {
    if (g_parallel) return ((parallel_for_fn)SLOT(g_api, S_PARALLEL_FOR))(ctx, fn, total, 0, job);
    for (size_t i = 0; i < total; i++) fn(job, i);
    return NULL;
}

/* ---- LookupAdd, LookupAdd2 .. LookupAdd4 ---- */

#define MAX_TERMS 4
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MULTIVERSION
#endif

/* One row: o = s + (((l[0][i[0]] + l[1][i[1]]) + ...)); the index loads vectorise into gathers on AVX2 and
 * AVX-512 (each target picked at load time). */
MULTIVERSION static void add_terms(float *restrict o, const float *restrict s, int terms,
                                   const float *const *restrict l, const int32_t *const *restrict x, int64_t count) {
    const float *restrict l0 = l[0], *restrict l1 = l[1], *restrict l2 = l[2], *restrict l3 = l[3];
    const int32_t *restrict x0 = x[0], *restrict x1 = x[1], *restrict x2 = x[2], *restrict x3 = x[3];
    switch (terms) {
    case 1:
        for (int64_t p = 0; p < count; p++) o[p] = s[p] + l0[x0[p]];
        break;
    case 2:
        for (int64_t p = 0; p < count; p++) o[p] = s[p] + (l0[x0[p]] + l1[x1[p]]);
        break;
    case 3:
        for (int64_t p = 0; p < count; p++) o[p] = s[p] + ((l0[x0[p]] + l1[x1[p]]) + l2[x2[p]]);
        break;
    default:
        for (int64_t p = 0; p < count; p++) o[p] = s[p] + (((l0[x0[p]] + l1[x1[p]]) + l2[x2[p]]) + l3[x3[p]]);
    }
}

typedef struct {
    float *out;
    const float *scores, *lut[MAX_TERMS];
    const int32_t *index[MAX_TERMS];
    int64_t n, lut_plane[MAX_TERMS]; /* scores are (n, n) per (batch, head); lut t has lut_plane[t] */
    int terms;
} LookupJob;

static void lookup_one(void *arg, size_t bh) {
    const LookupJob *job = arg;
    const int64_t n = job->n, plane = n * n;
    const float *l[MAX_TERMS] = {0};
    const int32_t *x[MAX_TERMS] = {0};
    for (int t = 0; t < job->terms; t++) l[t] = job->lut[t] + bh * job->lut_plane[t];
    for (int64_t i = 0; i < n; i++) {
        for (int t = 0; t < job->terms; t++) x[t] = job->index[t] + i * n;
        add_terms(job->out + bh * plane + i * n, job->scores + bh * plane + i * n, job->terms, l, x, n);
    }
}

static OrtStatus *lookup_compute(void *kernel, OrtKernelContext *ctx) {
    Tensor scores, lut[MAX_TERMS], index[MAX_TERMS];
    LookupJob job = {0};
    job.terms = (int)(intptr_t)kernel;
    TRY(input(ctx, 0, &scores));
    if (scores.rank != 4 || scores.dims[2] != scores.dims[3])
        return fail(E_INVALID_ARGUMENT, "scores must be [B, H, n, n] (rank %lld, last dim %lld)",
                    (long long)scores.rank, scores.rank ? scores.dims[scores.rank - 1] : 0);
    job.n = scores.dims[2];
    const int64_t planes = scores.dims[0] * scores.dims[1], plane = job.n * job.n;
    for (int t = 0; t < job.terms; t++) {
        TRY(input(ctx, 1 + 2 * t, &lut[t]));
        TRY(input(ctx, 2 + 2 * t, &index[t]));
        if (lut[t].rank != 4 || lut[t].dims[0] * lut[t].dims[1] != planes || numel(&index[t]) != plane)
            return fail(E_INVALID_ARGUMENT, "lut must be [B, H, L, K] over the scores' B*H=%lld planes and index "
                        "[n*n=%lld]", planes, plane);
        job.lut_plane[t] = lut[t].dims[2] * lut[t].dims[3];
        TRY(check_index((const int32_t *)index[t].data, plane, 0, job.lut_plane[t]));
        job.lut[t] = lut[t].data;
        job.index[t] = (const int32_t *)index[t].data;
    }
    OrtValue *out = NULL;
    TRY(((output_fn)SLOT(g_api, S_OUTPUT))(ctx, 0, scores.dims, 4, &out));
    TRY(((mutable_data_fn)SLOT(g_api, S_MUTABLE_DATA))(out, (void **)&job.out));
    job.scores = scores.data;
    return parallel(ctx, lookup_one, (size_t)planes, &job);
}

/* ---- BucketSumRows ---- */

typedef struct {
    float *out;
    const float *attn;
    const int32_t *index;
    int64_t n, planes, buckets;
} SumJob;

/* One query row i over every (batch, head) plane, PLANES planes at a time: independent accumulators, so a run
 * of keys in the same bucket does not serialise on one sum. */
#define PLANES 4
static void sum_one(void *arg, size_t row) {
    const SumJob *job = arg;
    const int64_t n = job->n, k = job->buckets, i = (int64_t)row;
    const int32_t *idx = job->index + i * n;
    float *out = job->out + i * job->planes * k;
    memset(out, 0, (size_t)(job->planes * k) * sizeof(float));
    int64_t bh = 0;
    for (; bh + PLANES <= job->planes; bh += PLANES) {
        const float *r[PLANES];
        float *acc[PLANES];
        for (int q = 0; q < PLANES; q++) {
            r[q] = job->attn + ((bh + q) * n + i) * n;
            acc[q] = out + (bh + q) * k;
        }
        for (int64_t j = 0; j < n; j++) {
            const int32_t b = idx[j];
            if (b < 0) continue;
            for (int q = 0; q < PLANES; q++) acc[q][b] += r[q][j];
        }
    }
    for (; bh < job->planes; bh++) {
        const float *r = job->attn + (bh * n + i) * n;
        float *acc = out + bh * k;
        for (int64_t j = 0; j < n; j++) {
            if (idx[j] >= 0) acc[idx[j]] += r[j];
        }
    }
}

static OrtStatus *sum_compute(void *kernel, OrtKernelContext *ctx) {
    Tensor attn, index;
    SumJob job = {0};
    job.buckets = (int64_t)(intptr_t)kernel;
    TRY(input(ctx, 0, &attn));
    TRY(input(ctx, 1, &index));
    if (attn.rank != 4 || attn.dims[2] != attn.dims[3] || numel(&index) != attn.dims[2] * attn.dims[3])
        return fail(E_INVALID_ARGUMENT, "attn must be [B, H, n, n] and index [n, n] (attn rank %lld, index has %lld "
                    "values)", (long long)attn.rank, numel(&index));
    job.n = attn.dims[2];
    job.planes = attn.dims[0] * attn.dims[1];
    TRY(check_index((const int32_t *)index.data, job.n * job.n, -1, job.buckets));
    const int64_t dims[3] = {job.n, job.planes, job.buckets};
    OrtValue *out = NULL;
    TRY(((output_fn)SLOT(g_api, S_OUTPUT))(ctx, 0, dims, 3, &out));
    TRY(((mutable_data_fn)SLOT(g_api, S_MUTABLE_DATA))(out, (void **)&job.out));
    job.attn = attn.data;
    job.index = (const int32_t *)index.data;
    return parallel(ctx, sum_one, (size_t)job.n, &job);
}

/* ---- the op table ---- */

static const char *name_sum(const OrtCustomOp *op) { (void)op; return "BucketSumRows"; }
static const char *on_cpu(const OrtCustomOp *op) { (void)op; return NULL; }
static int input_type(const OrtCustomOp *op, size_t i);
static size_t count_sum(const OrtCustomOp *op) { (void)op; return 2; }
static int float_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return T_FLOAT; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static void destroy(void *kernel) { (void)kernel; }
static int required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }

/* LookupAdd (1 term) .. LookupAdd4: scores, then (lut, index) per term. */
static const char *name_lookup(const OrtCustomOp *op);
static size_t count_lookup(const OrtCustomOp *op);

static OrtStatus *create_lookup(const OrtCustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info,
                                void **kernel) {
    (void)api; (void)info;
    *kernel = (void *)(intptr_t)((op->GetInputTypeCount(op) - 1) / 2);
    return NULL;
}

static OrtStatus *create_sum(const OrtCustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info,
                             void **kernel) {
    (void)op; (void)api;
    int64_t k = 0;
    TRY(((attr_int64_fn)SLOT(g_api, S_ATTR_INT64))(info, "num_buckets", &k));
    if (k < 1 || k > (1 << 20)) return fail(E_INVALID_ARGUMENT, "BucketSumRows: num_buckets %lld outside [1, %lld]", k,
                                            1 << 20);
    *kernel = (void *)(intptr_t)k;
    return NULL;
}

#define OP(NAME, COUNT, CREATE, COMPUTE)                                                            \
    {16, NULL, NAME, on_cpu, input_type, COUNT, float_type, one, NULL, destroy, required, required, \
     required, NULL, NULL, NULL, NULL, CREATE, COMPUTE, {NULL}}

#define LOOKUP OP(name_lookup, count_lookup, create_lookup, lookup_compute)
static OrtCustomOp g_ops[] = {
    LOOKUP, LOOKUP, LOOKUP, LOOKUP, OP(name_sum, count_sum, create_sum, sum_compute),
};
#define N_OPS ((int)(sizeof g_ops / sizeof g_ops[0]))
#define SUM_OP (&g_ops[MAX_TERMS])

static const char *name_lookup(const OrtCustomOp *op) {
    static const char *names[MAX_TERMS] = {"LookupAdd", "LookupAdd2", "LookupAdd3", "LookupAdd4"};
    return names[op - g_ops];
}

static size_t count_lookup(const OrtCustomOp *op) { return 1 + 2 * (size_t)(op - g_ops + 1); }

/* float everywhere but the index inputs: every even input of the lookups, input 1 of BucketSumRows. */
static int input_type(const OrtCustomOp *op, size_t i) {
    if (op == SUM_OP) return i == 1 ? T_INT32 : T_FLOAT;
    return (i > 0 && i % 2 == 0) ? T_INT32 : T_FLOAT;
}

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options,
                                                                   const OrtApiBase *base) {
    static OrtCustomOpDomain *domain; /* lives as long as the process: sessions keep pointers into it */
    g_api = base->GetApi(1);
    if (!g_api) return NULL; /* cannot even make a status; ONNX Runtime then fails on the unknown ops */
    g_parallel = base->GetApi(17) != NULL;
    if (!domain) {
        TRY(((create_domain_fn)SLOT(g_api, S_CREATE_DOMAIN))("irpe.ort", &domain));
        for (int i = 0; i < N_OPS; i++) TRY(((domain_add_fn)SLOT(g_api, S_DOMAIN_ADD))(domain, &g_ops[i]));
    }
    return ((add_domain_fn)SLOT(g_api, S_ADD_DOMAIN))(options, domain);
}

/* A Python module too, so the installer builds it like the other extension and importlib finds its path. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ortops",
                                    "ONNX Runtime custom ops for iRPE (see artifact/ort_graph.py)", -1,
                                    NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__ortops(void) { return PyModule_Create(&module); }
