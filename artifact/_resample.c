/* Two vectorisable kernels for the exact 8-bit resize in resample.py (the GIL is released in both).
 *
 * rows(src, nrows, rowlen, bounds, kk, ksize, dst): for each output row i,
 *     dst[i, :] = clamp((2^21 + sum_t kk[i, t] * src[bounds[2i] + t, :]) >> 22, 0, 255)
 * with t < bounds[2i + 1]: Pillow's fixed-point 8-bit convolution (22 fraction bits), applied along
 * the first axis so the inner loop runs over contiguous bytes and the compiler vectorises it.
 * transpose(src, rows, cols, pixel, dst[, offset, stride]): dst[c, r, :] = src[r, c, :] for pixels of
 *     ``pixel`` bytes; with ``offset`` and ``stride`` (bytes), row r starts at src + offset + r * stride (a
 *     window of a larger image, read in place).
 * hrows(src, nrows, ncols, stride, offset, bounds, kk, ksize, dst): the horizontal pass of 3-byte pixels,
 *     dst[r, i, :] = clamp((2^21 + sum_t kk[i, t] * src[r, bounds[2i] + t, :]) >> 22, 0, 255) for the window
 *     of ``nrows`` x ``ncols`` pixels at byte ``offset`` of ``src`` (rows ``stride`` bytes apart), read in place.
 *     Strips of STRIP rows are transposed into a small tile (in L1), convolved along its first axis with the
 *     accumulators in registers, and transposed back: the source is read once, no full-size intermediate.
 * lookup(src, pixels, table, dst): dst[c, i] = table[c, src[i, c]] for 3-channel uint8 pixels and a
 *     (3, 256) float32 table: scale + normalise by table lookup, HWC uint8 -> CHW float32 in one pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FRACTION_BITS 22

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MULTIVERSION
#endif

/* One output row: out[j] = clamp((2^21 + sum_t k[t] * rows[t * rowlen + j]) >> 22). Inlined into each
 * caller (and each target clone); a caller passing a constant rowlen gets the loops unrolled and the
 * accumulators in registers. */
static inline __attribute__((always_inline)) void convolve_one(const uint8_t *rows, Py_ssize_t rowlen,
                                                               const int32_t *k, int32_t taps, int32_t *acc,
                                                               uint8_t *out) {
    for (Py_ssize_t j = 0; j < rowlen; j++) {
        acc[j] = 1 << (FRACTION_BITS - 1);
    }
    for (int32_t t = 0; t < taps; t++) {
        const int32_t w = k[t];
        const uint8_t *row = rows + (Py_ssize_t)t * rowlen;
        for (Py_ssize_t j = 0; j < rowlen; j++) {
            acc[j] += w * (int32_t)row[j];
        }
    }
    for (Py_ssize_t j = 0; j < rowlen; j++) {
        const int32_t v = acc[j] >> FRACTION_BITS;
        out[j] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
}

MULTIVERSION
static void convolve_rows(const uint8_t *src, Py_ssize_t rowlen, const int32_t *bounds, const int32_t *kk,
                          Py_ssize_t ksize, Py_ssize_t nout, uint8_t *dst, int32_t *acc) {
    for (Py_ssize_t i = 0; i < nout; i++) {
        convolve_one(src + (Py_ssize_t)bounds[2 * i] * rowlen, rowlen, kk + i * ksize, bounds[2 * i + 1], acc,
                     dst + i * rowlen);
    }
}

static int check_size(Py_buffer *b, Py_ssize_t want, const char *name) {
    if (b->len < want) {
        PyErr_Format(PyExc_ValueError, "%s: buffer has %zd bytes, needs %zd", name, b->len, want);
        return 0;
    }
    return 1;
}

static int check_bounds(const int32_t *b, Py_ssize_t nout, Py_ssize_t ksize, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < nout; i++) {
        if (b[2 * i] < 0 || b[2 * i + 1] < 0 || b[2 * i + 1] > ksize || b[2 * i] + b[2 * i + 1] > n) {
            PyErr_SetString(PyExc_ValueError, "bounds out of range");
            return 0;
        }
    }
    return 1;
}

static PyObject *rows(PyObject *self, PyObject *args) {
    Py_buffer src, bounds, kk, dst;
    Py_ssize_t nrows, rowlen, ksize, nout;
    if (!PyArg_ParseTuple(args, "y*nny*y*nw*", &src, &nrows, &rowlen, &bounds, &kk, &ksize, &dst)) {
        return NULL;
    }
    PyObject *result = NULL;
    int32_t *acc = NULL;
    nout = bounds.len / (Py_ssize_t)(2 * sizeof(int32_t));
    const int32_t *b = (const int32_t *)bounds.buf;
    int ok = rowlen > 0 && ksize > 0 && check_size(&src, nrows * rowlen, "src") &&
             check_size(&kk, nout * ksize * (Py_ssize_t)sizeof(int32_t), "kk") &&
             check_size(&dst, nout * rowlen, "dst");
    ok = ok && check_bounds(b, nout, ksize, nrows);
    if (ok && !(acc = malloc((size_t)rowlen * sizeof(int32_t)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        convolve_rows(src.buf, rowlen, b, kk.buf, ksize, nout, dst.buf, acc);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    free(acc);
    PyBuffer_Release(&src);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&kk);
    PyBuffer_Release(&dst);
    return result;
}

static inline void transpose_tiles(const uint8_t *src, Py_ssize_t nr, Py_ssize_t nc, Py_ssize_t px,
                                   Py_ssize_t stride, uint8_t *dst) {
    const Py_ssize_t tile = 16;
    for (Py_ssize_t r0 = 0; r0 < nr; r0 += tile) {
        const Py_ssize_t r1 = r0 + tile < nr ? r0 + tile : nr;
        for (Py_ssize_t c0 = 0; c0 < nc; c0 += tile) {
            const Py_ssize_t c1 = c0 + tile < nc ? c0 + tile : nc;
            for (Py_ssize_t r = r0; r < r1; r++) {
                const uint8_t *in = src + r * stride + c0 * px;
                uint8_t *out = dst + (c0 * nr + r) * px;
                for (Py_ssize_t c = c0; c < c1; c++, in += px, out += nr * px) {
                    memcpy(out, in, (size_t)px);  /* constant px after inlining: plain moves */
                }
            }
        }
    }
}

static void transpose_any(const uint8_t *src, Py_ssize_t nr, Py_ssize_t nc, Py_ssize_t px, Py_ssize_t stride,
                          uint8_t *dst) {
    if (px == 3) {
        transpose_tiles(src, nr, nc, 3, stride, dst);
    } else if (px == 1) {
        transpose_tiles(src, nr, nc, 1, stride, dst);
    } else {
        transpose_tiles(src, nr, nc, px, stride, dst);
    }
}

static PyObject *transpose(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t nr, nc, px, offset = 0, stride = -1;
    if (!PyArg_ParseTuple(args, "y*nnnw*|nn", &src, &nr, &nc, &px, &dst, &offset, &stride)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (stride < 0) {
        stride = nc * px;
    }
    /* the last row read ends at offset + (nr - 1) * stride + nc * px */
    int ok = nr >= 0 && nc >= 0 && px > 0 && offset >= 0 && stride >= nc * px;
    if (ok && nr > 0 && nc > 0) {
        ok = check_size(&src, offset + (nr - 1) * stride + nc * px, "src");
    }
    if (ok && check_size(&dst, nr * nc * px, "dst")) {
        Py_BEGIN_ALLOW_THREADS
        transpose_any((const uint8_t *)src.buf + offset, nr, nc, px, stride, dst.buf);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "transpose: bad sizes");
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

#define STRIP 32
#define STRIP_BYTES (STRIP * 3)

MULTIVERSION
static void convolve_strip(const uint8_t *tile, Py_ssize_t rowlen, const int32_t *bounds, const int32_t *kk,
                           Py_ssize_t ksize, Py_ssize_t nout, uint8_t *out) {
    /* rowlen <= STRIP_BYTES; a full strip has a constant row length (accumulators in registers) */
    int32_t acc[STRIP_BYTES];
    for (Py_ssize_t i = 0; i < nout; i++) {
        const int32_t first = bounds[2 * i], taps = bounds[2 * i + 1];
        if (rowlen == STRIP_BYTES) {
            convolve_one(tile + first * STRIP_BYTES, STRIP_BYTES, kk + i * ksize, taps, acc, out + i * STRIP_BYTES);
        } else {
            convolve_one(tile + first * rowlen, rowlen, kk + i * ksize, taps, acc, out + i * rowlen);
        }
    }
}

static void hrows_strips(const uint8_t *base, Py_ssize_t nr, Py_ssize_t nc, Py_ssize_t stride, const int32_t *b,
                         const int32_t *kk, Py_ssize_t ksize, Py_ssize_t nout, uint8_t *dst, uint8_t *tile,
                         uint8_t *out) {
    for (Py_ssize_t r0 = 0; r0 < nr; r0 += STRIP) {
        const Py_ssize_t n = r0 + STRIP < nr ? STRIP : nr - r0;
        transpose_any(base + r0 * stride, n, nc, 3, stride, tile);  /* tile[c, s, :] = src[r0 + s, c, :] */
        convolve_strip(tile, n * 3, b, kk, ksize, nout, out);         /* out[i, s, :] */
        transpose_any(out, nout, n, 3, n * 3, dst + r0 * nout * 3);  /* dst[r0 + s, i, :] */
    }
}

static PyObject *hrows(PyObject *self, PyObject *args) {
    Py_buffer src, bounds, kk, dst;
    Py_ssize_t nr, nc, stride, offset, ksize;
    if (!PyArg_ParseTuple(args, "y*nnnny*y*nw*", &src, &nr, &nc, &stride, &offset, &bounds, &kk, &ksize, &dst)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *tile = NULL, *out = NULL;
    const Py_ssize_t nout = bounds.len / (Py_ssize_t)(2 * sizeof(int32_t));
    int ok = nr > 0 && nc > 0 && ksize > 0 && nout > 0 && offset >= 0 && stride >= 3 * nc;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "hrows: bad sizes");
    }
    ok = ok && check_size(&src, offset + (nr - 1) * stride + 3 * nc, "src") &&
         check_size(&kk, nout * ksize * (Py_ssize_t)sizeof(int32_t), "kk") && check_size(&dst, nr * nout * 3, "dst") &&
         check_bounds(bounds.buf, nout, ksize, nc);
    if (ok && (!(tile = malloc((size_t)(nc * STRIP_BYTES))) || !(out = malloc((size_t)(nout * STRIP_BYTES))))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        hrows_strips((const uint8_t *)src.buf + offset, nr, nc, stride, bounds.buf, kk.buf, ksize, nout, dst.buf, tile,
                     out);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    free(tile);
    free(out);
    PyBuffer_Release(&src);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&kk);
    PyBuffer_Release(&dst);
    return result;
}

static void lookup3(const uint8_t *src, Py_ssize_t n, const float *table, float *dst) {
    const float *t0 = table, *t1 = table + 256, *t2 = table + 512;
    float *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++, src += 3) {
        d0[i] = t0[src[0]];
        d1[i] = t1[src[1]];
        d2[i] = t2[src[2]];
    }
}

static PyObject *lookup(PyObject *self, PyObject *args) {
    Py_buffer src, table, dst;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*ny*w*", &src, &n, &table, &dst)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (n >= 0 && check_size(&src, 3 * n, "src") && check_size(&table, 3 * 256 * (Py_ssize_t)sizeof(float), "table") &&
        check_size(&dst, 3 * n * (Py_ssize_t)sizeof(float), "dst")) {
        Py_BEGIN_ALLOW_THREADS
        lookup3(src.buf, n, table.buf, dst.buf);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "lookup: bad sizes");
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&table);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"rows", rows, METH_VARARGS, "rows(src, nrows, rowlen, bounds, kk, ksize, dst): fixed-point convolution along axis 0"},
    {"transpose", transpose, METH_VARARGS,
     "transpose(src, rows, cols, pixel_bytes, dst[, offset, stride]): swap the first two axes"},
    {"hrows", hrows, METH_VARARGS,
     "hrows(src, nrows, ncols, stride, offset, bounds, kk, ksize, dst): horizontal pass of 3-byte pixels, in strips"},
    {"lookup", lookup, METH_VARARGS, "lookup(src, pixels, table, dst): HWC uint8 -> CHW float32 via a (3, 256) table"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample", "Exact 8-bit resize kernels", -1, methods};

PyMODINIT_FUNC PyInit__resample(void) { return PyModule_Create(&module); }
