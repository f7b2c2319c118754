/* The fused iRPE attention for OpenVINO, as a Python module (the kernel is ovops_kernel.c).
 *
 * plan(n, indices, planes, bucket_index, kv, grid) -> capsule: one attention layer's lookups and value-side
 *   buckets, checked against the tables they read and laid out once:
 *     indices  tuple of int32 (n * n,), up to MAX_TERMS: term[i, j] = lut[b, h].flat[index[i * n + j]]
 *     planes   tuple of ints: each lut's entries per (b, h), L * K; every index value must lie below it
 *     bucket_index int32 (n * n,) in [-1, kv), or None: the value side's bucket of each (query, key), -1 none
 *     grid     (skip, gh, gw, mb) or None: the patch grid, for the separable form of the product method
 * attention(q, kt, v, ctx, luts, plan, sums, threads[, scalar]):
 *     q, kt, v bfloat16 (B, H, n, d), (B, H, d, n), (B, H, n, d): queries (scaled), keys transposed, values
 *     ctx      out, float32 or bfloat16 (B, H, n, d): softmax_j(q_i . k_j + the terms) @ v
 *     luts     tuple of float32 or bfloat16 (B, H, L, K), one per index of the plan
 *     sums     out, float32 (n, B * H, kv), or None (exactly when the plan has no bucket index):
 *              sums[i, b * H + h, k] = sum_j [bucket_index[i * n + j] == k] p[b, h, i, j]
 *     threads  the planes are split over this many threads, the caller's own one of them
 *     scalar   1: the plain C reference kernel whatever the CPU (tests)
 * (bfloat16 buffers are any 2-byte type: numpy has no bfloat16.) Every buffer's type and shape is checked on each
 * call and each index against the lut it reads when the plan is made: the artifact is untrusted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "ovops_kernel.h"

typedef struct {
    int terms;
    int64_t n, kv, plane[MAX_TERMS], skip, gh, gw, mb;
    int32_t *index[MAX_TERMS], *window[MAX_TERMS], *index_t[MAX_TERMS], *column[MAX_TERMS];
    int32_t *bucket, *ra, *cb;
} Plan;

static void plan_free(PyObject *capsule) {
    Plan *P = PyCapsule_GetPointer(capsule, "irpe.ovops.plan");
    if (!P) return;
    for (int t = 0; t < MAX_TERMS; t++) free(P->index[t]), free(P->window[t]), free(P->index_t[t]), free(P->column[t]);
    free(P->bucket), free(P->ra), free(P->cb), free(P);
}

/* A copy of an int32 (n * n,) index whose values lie in [lo, hi); NULL with an exception set. */
static int32_t *index_copy(PyObject *obj, int64_t n, int64_t lo, int64_t hi, const char *what) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    const char *f = b.format ? b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int32_t *out = NULL;
    if (b.itemsize != 4 || !strchr("il", f[0]) || b.len != n * n * 4) {
        PyErr_Format(PyExc_ValueError, "%s: expected %lld int32 values (n * n)", what, (long long)(n * n));
    } else if (!(out = malloc((size_t)b.len + 4))) {
        PyErr_NoMemory();
    } else {
        memcpy(out, b.buf, (size_t)b.len);
        for (int64_t k = 0; k < n * n; k++)
            if (out[k] < lo || out[k] >= hi) {
                PyErr_Format(PyExc_ValueError, "%s: value %d at %lld is outside the table read [%lld, %lld)", what,
                             out[k], (long long)k, (long long)lo, (long long)hi);
                free(out), out = NULL;
                break;
            }
    }
    PyBuffer_Release(&b);
    return out;
}

/* Each query row's first entry read when the row's reads lie within WINDOW entries (else -1); when no row does
 * but every key column does (the q side, read at key j), the index transposed and each column's first entry. */
static int windows(Plan *P, int t) {
    const int64_t n = P->n;
    const int32_t *x = P->index[t];
    int any = 0;
    if (!(P->window[t] = malloc((size_t)n * 4))) return -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t least = INT32_MAX, most = INT32_MIN;
        for (int64_t j = 0; j < n; j++) least = x[i * n + j] < least ? x[i * n + j] : least, most = x[i * n + j] > most ? x[i * n + j] : most;
        any |= (P->window[t][i] = (int64_t)most - least < WINDOW ? least : -1) >= 0;
    }
    if (any) return 0;
    int32_t *xt = malloc((size_t)(n * n) * 4), *start = malloc((size_t)n * 4);
    if (!xt || !start) return free(xt), free(start), -1;
    for (int64_t j = 0; j < n; j++) {
        int32_t least = INT32_MAX, most = INT32_MIN;
        for (int64_t i = 0; i < n; i++) {
            int32_t v = xt[j * n + i] = x[i * n + j];
            least = v < least ? v : least, most = v > most ? v : most;
        }
        if ((int64_t)most - least >= WINDOW) return free(xt), free(start), 0; /* neither: gathers */
        start[j] = least;
    }
    P->index_t[t] = xt, P->column[t] = start;
    return 0;
}

/* Over `count` keys `stride` apart, the bucket (row part patch / mb, or column part patch % mb) of each as
 * runs: runs[2 k], runs[2 k + 1] = [first, end) of bucket k (0, 0 when it has none); -1 when a bucket is in two
 * runs or out of range. */
static int runs_of(const int32_t *patch, int64_t count, int64_t stride, int64_t mb, int rows, int32_t *runs,
                   int64_t buckets) {
    for (int64_t k = 0; k < 2 * buckets; k++) runs[k] = 0;
    int32_t seen = -1;
    for (int64_t x = 0; x < count; x++) {
        int32_t v = patch[x * stride], k = rows ? v / (int32_t)mb : v % (int32_t)mb;
        if (v < 0 || k >= buckets || (k != seen && runs[2 * k + 1])) return -1;
        if (k != seen) runs[2 * k] = (int32_t)x, seen = k;
        runs[2 * k + 1] = (int32_t)x + 1;
    }
    return 0;
}

/* The separable form of the bucket index on the grid (skip, gh, gw, mb), when it has it: prefix keys left out,
 * patch keys in bucket ra(r) * mb + cb(c) (key row r, column c), each row bucket a run of key rows and each
 * column bucket a run of columns. Kept per query: ra = the row runs' [first, end) (-1: a prefix query), cb = 16
 * lanes "last column of bucket b" then 16 lanes "last column before it" (-1: none; empty buckets: 0, 0). */
static int separable(Plan *P, int64_t skip, int64_t gh, int64_t gw, int64_t mb) {
    const int64_t n = P->n, ma = mb > 0 ? P->kv / mb : 0;
    if (skip < 0 || gh < 1 || gw < 1 || gw > 16 || mb < 1 || mb > 16 || P->kv % mb || skip + gh * gw != n) return 0;
    int32_t *ra = malloc((size_t)(n * 2 * ma) * 4 + 4), *cb = malloc((size_t)n * 32 * 4);
    if (!ra || !cb) return free(ra), free(cb), -1;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *b = P->bucket + i * n, *patch = b + skip;
        int32_t *runs = ra + i * 2 * ma, *last = cb + i * 32, *prior = last + 16, cols[32];
        int ok = 1;
        for (int64_t j = 0; j < skip; j++) ok &= b[j] == -1;
        if (ok && patch[0] < 0) { /* a prefix query: all keys left out */
            for (int64_t j = 0; j < gh * gw; j++) ok &= patch[j] == -1;
            runs[0] = -1;
        } else if (ok) {
            ok = runs_of(patch, gh, gw, mb, 1, runs, ma) == 0 && runs_of(patch, gw, 1, mb, 0, cols, 16) == 0;
            for (int64_t k = 0; k < 16; k++)
                last[k] = cols[2 * k + 1] ? cols[2 * k + 1] - 1 : 0, prior[k] = cols[2 * k + 1] ? cols[2 * k] - 1 : 0;
            for (int64_t r = 0; ok && r < gh; r++)
                for (int64_t c = 0; c < gw; c++)
                    ok &= patch[r * gw + c] == (patch[r * gw] / (int32_t)mb) * (int32_t)mb + patch[c] % (int32_t)mb;
        }
        if (!ok) return free(ra), free(cb), 0;
    }
    P->ra = ra, P->cb = cb, P->skip = skip, P->gh = gh, P->gw = gw, P->mb = mb;
    return 0;
}

static PyObject *plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *indices, *planes, *bucket, *grid;
    long long n, kv;
    if (!PyArg_ParseTuple(args, "LO!O!OLO", &n, &PyTuple_Type, &indices, &PyTuple_Type, &planes, &bucket, &kv, &grid))
        return NULL;
    Plan *P = calloc(1, sizeof(Plan));
    if (!P) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(P, "irpe.ovops.plan", plan_free);
    if (!capsule) return free(P), NULL;
    P->n = n, P->kv = kv, P->terms = (int)PyTuple_GET_SIZE(indices);
    if (n < 1 || P->terms > MAX_TERMS || PyTuple_GET_SIZE(planes) != P->terms) {
        PyErr_Format(PyExc_ValueError, "plan: n >= 1 and at most %d (index, plane) pairs", MAX_TERMS);
        return Py_DECREF(capsule), NULL;
    }
    for (int t = 0; t < P->terms; t++) {
        P->plane[t] = PyLong_AsLongLong(PyTuple_GET_ITEM(planes, t));
        if (PyErr_Occurred() || !(P->index[t] = index_copy(PyTuple_GET_ITEM(indices, t), n, 0, P->plane[t], "index")))
            return Py_DECREF(capsule), NULL;
        if (windows(P, t) < 0) return Py_DECREF(capsule), PyErr_NoMemory();
    }
    if (bucket != Py_None) {
        long long skip, gh, gw, mb;
        if (kv < 1 || !(P->bucket = index_copy(bucket, n, -1, kv, "bucket_index"))) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "plan: kv >= 1 with a bucket index");
            return Py_DECREF(capsule), NULL;
        }
        if (grid != Py_None && !PyArg_ParseTuple(grid, "LLLL", &skip, &gh, &gw, &mb)) return Py_DECREF(capsule), NULL;
        if (grid != Py_None && separable(P, skip, gh, gw, mb) < 0) return Py_DECREF(capsule), PyErr_NoMemory();
    }
    return capsule;
}

typedef struct {
    Py_buffer views[MAX_TERMS + 5];
    int count;
} Views;

/* A C-contiguous `ndim`-d buffer of float32, or of bfloat16 (any 2-byte format) where `bf16` allows it. */
static int view(Views *V, PyObject *obj, int writable, int bf16, int ndim, const char *what, Py_buffer **out) {
    Py_buffer *b = &V->views[V->count];
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    V->count++;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = (b->itemsize == 4 && f[0] == 'f' && bf16 != 2) || (b->itemsize == 2 && bf16);
    if (!ok || b->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected a %d-d %s buffer, got a %d-d one of format '%s'", what, ndim,
                     bf16 == 2 ? "bfloat16" : bf16 ? "float32 or bfloat16" : "float32", b->ndim, f);
        return -1;
    }
    *out = b;
    return 0;
}

static int same_dims(const Py_buffer *b, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const char *what) {
    if (b->shape[0] == d0 && b->shape[1] == d1 && b->shape[2] == d2 && b->shape[3] == d3) return 0;
    PyErr_Format(PyExc_ValueError, "%s: shape (%zd, %zd, %zd, %zd), expected (%lld, %lld, %lld, %lld)", what,
                 b->shape[0], b->shape[1], b->shape[2], b->shape[3], (long long)d0, (long long)d1, (long long)d2,
                 (long long)d3);
    return -1;
}

/* args: q, kt, v, ctx, luts, plan, sums */
static int fill_job(Job *J, Views *V, PyObject *const *args) {
    Py_buffer *q, *kt, *v, *ctx, *lut, *sums;
    const Plan *P = PyCapsule_GetPointer(args[5], "irpe.ovops.plan");
    if (!P || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != P->terms) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "luts: a tuple of %d", P->terms);
        return -1;
    }
    if (view(V, args[0], 0, 2, 4, "q", &q) < 0 || view(V, args[1], 0, 2, 4, "kt", &kt) < 0 ||
        view(V, args[2], 0, 2, 4, "v", &v) < 0 || view(V, args[3], 1, 1, 4, "ctx", &ctx) < 0)
        return -1;
    int64_t B = q->shape[0], H = q->shape[1], n = q->shape[2], d = q->shape[3];
    if (n != P->n || d % 2) {
        PyErr_Format(PyExc_ValueError, "q: %lld tokens of even width expected, got %lld of %lld", (long long)P->n,
                     (long long)n, (long long)d);
        return -1;
    }
    if (same_dims(kt, B, H, d, n, "kt") || same_dims(v, B, H, n, d, "v") || same_dims(ctx, B, H, n, d, "ctx")) return -1;
    *J = (Job){.q = q->buf, .kt = kt->buf, .v = v->buf, .ctx = ctx->buf, .ctx_bf16 = ctx->itemsize == 2,
               .terms = P->terms, .bh = B * H, .n = n, .d = d, .vector = ovops_vector_cpu()};
    for (int t = 0; t < J->terms; t++) {
        if (view(V, PyTuple_GET_ITEM(args[4], t), 0, 1, 4, "lut", &lut) < 0) return -1;
        if (lut->shape[0] != B || lut->shape[1] != H || lut->shape[2] * lut->shape[3] != P->plane[t]) {
            PyErr_Format(PyExc_ValueError, "lut %d: (%lld, %lld, %lld entries) expected", t, (long long)B,
                         (long long)H, (long long)P->plane[t]);
            return -1;
        }
        J->lut[t] = lut->buf, J->lut_bf16[t] = lut->itemsize == 2, J->plane[t] = P->plane[t];
        J->index[t] = P->index[t], J->window[t] = P->window[t], J->index_t[t] = P->index_t[t];
        J->column[t] = P->column[t];
    }
    if ((args[6] == Py_None) != (P->bucket == NULL)) {
        PyErr_SetString(PyExc_ValueError, "sums: given exactly when the plan has a bucket index");
        return -1;
    }
    if (args[6] == Py_None) return 0;
    if (view(V, args[6], 1, 0, 3, "sums", &sums) < 0) return -1;
    if (sums->shape[0] != n || sums->shape[1] != B * H || sums->shape[2] != P->kv) {
        PyErr_SetString(PyExc_ValueError, "sums must be (n, B * H, kv)");
        return -1;
    }
    J->sums = sums->buf, J->bucket = P->bucket, J->kv = P->kv, J->ra = P->ra, J->cb = P->cb;
    J->skip = P->skip, J->gh = P->gh, J->gw = P->gw, J->mb = P->mb;
    return 0;
}

static PyObject *attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "attention(q, kt, v, ctx, luts, plan, sums, threads[, scalar])");
        return NULL;
    }
    long threads = PyLong_AsLong(args[7]);
    int scalar = nargs == 9 ? PyObject_IsTrue(args[8]) : 0;
    if ((threads == -1 || scalar < 0) && PyErr_Occurred()) return NULL;
    Views V = {.count = 0};
    Job J;
    int rc = fill_job(&J, &V, args);
    if (scalar) J.vector = 0;
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS rc = ovops_run(&J, (int)threads);
        Py_END_ALLOW_THREADS if (rc) PyErr_NoMemory();
    }
    for (int i = 0; i < V.count; i++) PyBuffer_Release(&V.views[i]);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

static PyObject *vectorised(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(ovops_vector_cpu());
}

static PyMethodDef methods[] = {
    {"plan", plan, METH_VARARGS,
     "plan(n, indices, planes, bucket_index, kv, grid): one layer's lookup indices (int32 (n * n,), each into a "
     "lut plane of planes[t] entries) and value-side buckets (int32 (n * n,) in [-1, kv), or None), checked and laid "
     "out once; grid (skip, gh, gw, mb) or None"},
    {"attention", (PyCFunction)(void (*)(void))attention, METH_FASTCALL,
     "attention(q, kt, v, ctx, luts, plan, sums, threads): iRPE attention of bfloat16 q, k^T, v into ctx (float32 "
     "or bfloat16) and the value side's bucket sums (float32 (n, B * H, kv), or None)"},
    {"vectorised", vectorised, METH_NOARGS, "whether the AVX-512 BF16 kernel runs on this CPU"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ovops", "iRPE attention for OpenVINO", -1, methods};

PyMODINIT_FUNC PyInit__ovops(void) {
    ovops_init_cpus();
    return PyModule_Create(&module);
}
