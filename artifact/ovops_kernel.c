/* The fused iRPE attention kernel: one (batch, head) plane at a time, for OpenVINO's bf16 paths (the Python
 * glue is _ovops.c; artifact/openvino_attention.py runs it as an OpenVINO custom op).
 *
 * OpenVINO runs plain DeiT's attention as one fused subgraph that never writes the (n, n) scores. With iRPE the
 * lookups (gathers writing (B, H, n, n) tensors), their sum, the softmax and the value side's bucket sums are
 * separate passes over (B, H, n, n) tensors, and on a CPU those passes, not the multiply-adds, are what iRPE
 * costs. Here a block of 8 query rows lives in cache: q k^T and p v run as AVX-512 BF16 dot products (f32
 * accumulation), the lookups, the softmax and the bucket sums in f32 between them.
 */
#define _GNU_SOURCE
#include "ovops_kernel.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define ROWS 8 /* query rows per block of the vector kernel */

typedef struct {
    const Job *job;
    int64_t begin, end; /* planes */
    int failed;
} Part;

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static inline float lut_at(const Job *J, int t, int64_t k) {
    return J->lut_bf16[t] ? from_bf16(((const uint16_t *)J->lut[t])[k]) : ((const float *)J->lut[t])[k];
}

static inline uint16_t to_bf16(float x) { /* round to nearest even (finite inputs) */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The value side's sums of row i of plane bh from its unnormalised exponentials e: acc holds 4 interleaved
 * copies of kv + 1 slots (slot 0 takes the keys left out), so that keys in one bucket do not wait on each other. */
static void bucket_sums(const Job *J, int64_t bh, int64_t i, const float *e, float inv, float *acc) {
    const int64_t n = J->n, w = J->kv + 1;
    memset(acc, 0, (size_t)(4 * w) * sizeof(float));
    const int32_t *b = J->bucket + i * n;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        acc[b[j] + 1] += e[j];
        acc[w + b[j + 1] + 1] += e[j + 1];
        acc[2 * w + b[j + 2] + 1] += e[j + 2];
        acc[3 * w + b[j + 3] + 1] += e[j + 3];
    }
    for (; j < n; j++) acc[b[j] + 1] += e[j];
    float *out = J->sums + (i * J->bh + bh) * J->kv;
    for (int64_t k = 1; k < w; k++) out[k - 1] = (acc[k] + acc[w + k] + acc[2 * w + k] + acc[3 * w + k]) * inv;
}

/* The reference: one plane in plain C (any CPU), the probabilities rounded to bfloat16 before p v as the vector
 * kernel does. scratch: 2 n floats + 4 (kv + 1). */
static void plane_scalar(const Job *J, int64_t bh, float *scratch) {
    const int64_t n = J->n, d = J->d;
    const uint16_t *q = J->q + bh * n * d, *kt = J->kt + bh * d * n, *v = J->v + bh * n * d;
    float *e = scratch, *p = scratch + n, *acc = scratch + 2 * n;
    for (int64_t i = 0; i < n; i++) {
        float top = -INFINITY, total = 0.f;
        for (int64_t j = 0; j < n; j++) {
            float s = 0.f;
            for (int64_t c = 0; c < d; c++) s += from_bf16(q[i * d + c]) * from_bf16(kt[c * n + j]);
            for (int t = 0; t < J->terms; t++) s += lut_at(J, t, bh * J->plane[t] + J->index[t][i * n + j]);
            e[j] = s;
            top = s > top ? s : top;
        }
        for (int64_t j = 0; j < n; j++) total += e[j] = expf(e[j] - top);
        float inv = 1.f / total;
        for (int64_t j = 0; j < n; j++) p[j] = from_bf16(to_bf16(e[j] * inv));
        for (int64_t c = 0; c < d; c++) {
            float s = 0.f;
            for (int64_t j = 0; j < n; j++) s += p[j] * from_bf16(v[j * d + c]);
            if (J->ctx_bf16)
                ((uint16_t *)J->ctx)[(bh * n + i) * d + c] = to_bf16(s);
            else
                ((float *)J->ctx)[(bh * n + i) * d + c] = s;
        }
        if (J->sums) bucket_sums(J, bh, i, e, inv, acc);
    }
}

#if HAVE_X86
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

/* e^x for x <= 0: 2^k p(r), x = k ln2 + r, |r| <= ln2 / 2, p of degree 6 (rel. err. ~2e-7); flushes to 0 below
 * -87 as expf does. */
AVX512 static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.3888889e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333333e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1666667e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666667e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

AVX512 static inline __mmask16 tail(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* One plane's operands in the pair layout vdpbf16ps reads, zero-padded: kp[c][j] = (k[j][2c], k[j][2c+1]) for
 * np keys, vp[jp][c] = (v[2jp][c], v[2jp+1][c]), qp[i][c] = (q[i][2c], q[i][2c+1]) for nq queries. */
typedef struct {
    uint32_t *kp, *vp, *qp;
    float *s;     /* ROWS x np scores, then exponentials */
    float inv[ROWS]; /* 1 / each row's sum of exponentials */
    uint32_t *pp; /* ROWS x np / 2 probability pairs */
    float *acc;
    float *lp[MAX_TERMS]; /* the plane's luts in float32 */
    float *tt[MAX_TERMS]; /* column-windowed luts: the plane's term, nq x np, row i = query i */
    float *u;             /* nq x nq: a column-windowed term by key rows, before its transpose */
    int64_t np, nq;
} Scratch;

/* The 16 x 16 block r transposed in place: r[k] lane l <- r[l] lane k. */
AVX512 static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) {
        r[k] = _mm512_shuffle_ps(t[k], t[k + 2], 0x44);
        r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], 0xee);
        r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0xdd);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
        r[k + 4] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88);
        r[k + 12] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xdd);
    }
}

/* 16 entries of a float32 table of `count` from `at` onwards (zeros past the end), looked up by index - base:
 * four registers and two two-source permutes, no gather (whose lanes would hit the same few lines). */
typedef struct {
    __m512 r[4];
} Window;

AVX512 static inline Window window_at(const float *table, int64_t at, int64_t count) {
    Window w;
    for (int k = 0; k < 4; k++) w.r[k] = _mm512_maskz_loadu_ps(tail(count - at - 16 * k), table + at + 16 * k);
    return w;
}

AVX512 static inline __m512 window_lookup(const Window *w, __m512i local) {
    __m512 low = _mm512_permutex2var_ps(w->r[0], local, w->r[1]);
    __m512 high = _mm512_permutex2var_ps(w->r[2], local, w->r[3]);
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(local, _mm512_set1_epi32(32)), low, high);
}

/* A column-windowed term of this plane as rows of queries: u[j][i] = lut[index[i][j]] by key rows (each in its
 * window), then transposed 16 x 16 into tt. */
AVX512 static void column_term(const Job *J, int t, Scratch *S) {
    const int64_t n = J->n, nq = S->nq;
    for (int64_t j = 0; j < n; j++) {
        Window w = window_at(S->lp[t], J->column[t][j], J->plane[t]);
        __m512i base = _mm512_set1_epi32(J->column[t][j]);
        for (int64_t i = 0; i < n; i += 16) {
            __m512i at = _mm512_maskz_loadu_epi32(tail(n - i), J->index_t[t] + j * n + i);
            _mm512_storeu_ps(S->u + j * nq + i, window_lookup(&w, _mm512_sub_epi32(at, base)));
        }
    }
    for (int64_t j0 = 0; j0 < n; j0 += 16)
        for (int64_t i0 = 0; i0 < n; i0 += 16) {
            __m512 r[16];
            for (int k = 0; k < 16; k++) r[k] = j0 + k < n ? _mm512_loadu_ps(S->u + (j0 + k) * nq + i0) : _mm512_setzero_ps();
            transpose16(r);
            for (int k = 0; k < 16 && i0 + k < n; k++) _mm512_storeu_ps(S->tt[t] + (i0 + k) * S->np + j0, r[k]);
        }
}

AVX512 static void pack_plane(const Job *J, int64_t bh, Scratch *S) {
    const int64_t n = J->n, d = J->d, half = d / 2;
    const uint16_t *q = J->q + bh * n * d, *kt = J->kt + bh * d * n, *v = J->v + bh * n * d;
    for (int64_t c = 0; c < half; c++) {
        const uint16_t *a = kt + 2 * c * n, *b = a + n;
        uint32_t *out = S->kp + c * S->np;
        for (int64_t j = 0; j < n; j++) out[j] = a[j] | (uint32_t)b[j] << 16;
        memset(out + n, 0, (size_t)(S->np - n) * 4);
    }
    for (int64_t jp = 0; jp < S->np / 2; jp++) {
        const uint16_t *a = v + 2 * jp * d, *b = a + d;
        uint32_t *out = S->vp + jp * d;
        for (int64_t c = 0; c < d; c++)
            out[c] = (2 * jp < n ? a[c] : 0) | (uint32_t)(2 * jp + 1 < n ? b[c] : 0) << 16;
    }
    memcpy(S->qp, q, (size_t)(n * d) * 2);
    memset(S->qp + n * half, 0, (size_t)((S->nq - n) * half) * 4);
    for (int t = 0; t < J->terms; t++) {
        const int64_t plane = J->plane[t];
        if (J->lut_bf16[t]) {
            const uint16_t *from = (const uint16_t *)J->lut[t] + bh * plane;
            for (int64_t k = 0; k < plane; k += 16) {
                __mmask16 m = tail(plane - k);
                __m256i h = _mm256_maskz_loadu_epi16(m, from + k);
                _mm512_mask_storeu_ps(S->lp[t] + k, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
            }
        } else {
            memcpy(S->lp[t], (const float *)J->lut[t] + bh * plane, (size_t)plane * 4);
        }
        if (J->column[t]) column_term(J, t, S);
    }
}

/* scores[r][j] for the ROWS queries from i0 (q . k as bf16 dot products), 32 keys at a time. */
AVX512 static void scores_block(const Job *J, const Scratch *S, int64_t i0) {
    const int64_t half = J->d / 2;
    for (int64_t j0 = 0; j0 < S->np; j0 += 32) {
        __m512 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t c = 0; c < half; c++) {
            __m512bh k0 = (__m512bh)_mm512_loadu_si512(S->kp + c * S->np + j0);
            __m512bh k1 = (__m512bh)_mm512_loadu_si512(S->kp + c * S->np + j0 + 16);
            for (int r = 0; r < ROWS; r++) {
                __m512bh qb = (__m512bh)_mm512_set1_epi32((int)S->qp[(i0 + r) * half + c]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, k0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, k1);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            _mm512_storeu_ps(S->s + r * S->np + j0, acc[r][0]);
            _mm512_storeu_ps(S->s + r * S->np + j0 + 16, acc[r][1]);
        }
    }
}

/* The bucket sums of a separable row: each row bucket's key rows summed (a run of rows), its lane prefix sums
 * taken, and each column bucket's sum read off as the difference of two prefix sums (a run of columns). */
AVX512 static void separable_sums(const Job *J, int64_t bh, int64_t i, const float *e, float inv) {
    float *out = J->sums + (i * J->bh + bh) * J->kv;
    const int64_t ma = J->kv / J->mb;
    const int32_t *rows = J->ra + i * 2 * ma; /* key rows [rows[2a], rows[2a+1]) are in row bucket a */
    if (rows[0] < 0) { /* a prefix query: no key in a bucket */
        memset(out, 0, (size_t)J->kv * 4);
        return;
    }
    const __m512i upto = _mm512_loadu_si512(J->cb + i * 32), before = _mm512_loadu_si512(J->cb + i * 32 + 16);
    const __mmask16 m = tail(J->gw), some = _mm512_cmpge_epi32_mask(before, _mm512_setzero_si512());
    const __m512 vi = _mm512_set1_ps(inv), zero = _mm512_setzero_ps();
    for (int64_t a = 0; a < ma; a++) {
        __m512 x = zero;
        for (int32_t r = rows[2 * a]; r < rows[2 * a + 1]; r++)
            x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, e + J->skip + r * J->gw));
        x = _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_setzero_si512(), 15)));
        x = _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_setzero_si512(), 14)));
        x = _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_setzero_si512(), 12)));
        x = _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_setzero_si512(), 8)));
        __m512 y = _mm512_sub_ps(_mm512_permutexvar_ps(upto, x), _mm512_maskz_permutexvar_ps(some, before, x));
        _mm512_mask_storeu_ps(out + a * J->mb, tail(J->mb), _mm512_mul_ps(y, vi));
    }
}

/* Row r of the block (query i): the terms added, softmax, probabilities packed in pairs, bucket sums. */
AVX512 static void softmax_row(const Job *J, Scratch *S, int64_t bh, int64_t i, int r) {
    const int64_t n = J->n;
    float *s = S->s + r * S->np;
    for (int t = 0; t < J->terms; t++) { /* each term added in a loop of its own: no branch per key */
        const int32_t *at = J->index[t] + i * n, base = J->window[t][i];
        if (J->column[t]) {
            const float *row = S->tt[t] + i * S->np;
            for (int64_t j = 0; j < n; j += 16) _mm512_storeu_ps(s + j, _mm512_add_ps(_mm512_loadu_ps(s + j), _mm512_loadu_ps(row + j)));
        } else if (base >= 0) {
            const Window w = window_at(S->lp[t], base, J->plane[t]);
            const __m512i from = _mm512_set1_epi32(base);
            for (int64_t j = 0; j < n; j += 16) {
                __m512i local = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(tail(n - j), at + j), from);
                _mm512_storeu_ps(s + j, _mm512_add_ps(_mm512_loadu_ps(s + j), window_lookup(&w, local)));
            }
        } else {
            for (int64_t j = 0; j < n; j += 16) {
                __mmask16 m = tail(n - j);
                __m512 x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_maskz_loadu_epi32(m, at + j), S->lp[t], 4);
                _mm512_storeu_ps(s + j, _mm512_add_ps(_mm512_loadu_ps(s + j), x));
            }
        }
    }
    __m512 top = _mm512_set1_ps(-INFINITY), total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) top = _mm512_mask_max_ps(top, tail(n - j), top, _mm512_loadu_ps(s + j));
    /* exponentials as bf16 pairs for p v (normalised there, per row: 64 products instead of n), and in f32 for
     * the bucket sums */
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    uint32_t *pp = S->pp + r * (S->np / 2);
    for (int64_t j = 0; j < S->np; j += 32) {
        __m512 a = _mm512_maskz_mov_ps(tail(n - j), exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mx)));
        __m512 b = _mm512_maskz_mov_ps(tail(n - j - 16), exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), mx)));
        total = _mm512_add_ps(total, _mm512_add_ps(a, b));
        _mm512_storeu_si512(pp + j / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a)); /* pairs (e[j], e[j+1]) */
        if (J->sums) _mm512_storeu_ps(s + j, a), _mm512_storeu_ps(s + j + 16, b);
    }
    float inv = S->inv[r] = 1.f / _mm512_reduce_add_ps(total);
    if (J->sums && J->ra)
        separable_sums(J, bh, i, s, inv);
    else if (J->sums)
        bucket_sums(J, bh, i, s, inv, S->acc);
}

/* ctx rows i0 .. i0+ROWS-1 (those < n) = p v, 32 columns of d at a time. */
AVX512 static void context_block(const Job *J, const Scratch *S, int64_t bh, int64_t i0) {
    const int64_t d = J->d, pairs = S->np / 2;
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
        __m512 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t jp = 0; jp < pairs; jp++) {
            __m512bh v0 = (__m512bh)_mm512_loadu_si512(S->vp + jp * d + c0);
            __m512bh v1 = (__m512bh)_mm512_loadu_si512(S->vp + jp * d + c0 + 16);
            for (int r = 0; r < ROWS; r++) {
                __m512bh pb = (__m512bh)_mm512_set1_epi32((int)S->pp[r * pairs + jp]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], pb, v0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], pb, v1);
            }
        }
        for (int r = 0; r < ROWS && i0 + r < J->n; r++) {
            int64_t at = (bh * J->n + i0 + r) * d + c0;
            __m512 inv = _mm512_set1_ps(S->inv[r]);
            acc[r][0] = _mm512_mul_ps(acc[r][0], inv), acc[r][1] = _mm512_mul_ps(acc[r][1], inv);
            if (J->ctx_bf16)
                _mm512_storeu_si512((uint16_t *)J->ctx + at, (__m512i)_mm512_cvtne2ps_pbh(acc[r][1], acc[r][0]));
            else
                _mm512_storeu_ps((float *)J->ctx + at, acc[r][0]), _mm512_storeu_ps((float *)J->ctx + at + 16, acc[r][1]);
        }
    }
}

AVX512 static void plane_avx512(const Job *J, int64_t bh, Scratch *S) {
    pack_plane(J, bh, S);
    for (int64_t i0 = 0; i0 < J->n; i0 += ROWS) {
        scores_block(J, S, i0);
        for (int r = 0; r < ROWS && i0 + r < J->n; r++) softmax_row(J, S, bh, i0 + r, r);
        for (int r = (int)(J->n - i0); r < ROWS; r++) memset(S->pp + r * (S->np / 2), 0, (size_t)S->np * 2);
        context_block(J, S, bh, i0);
    }
}

static int vector_ok(const Job *J) { /* the vector kernel's layout: d a multiple of 32 */
    return J->d % 32 == 0;
}
#endif

static void *run_part(void *arg) {
    Part *P = (Part *)arg;
    const Job *J = P->job;
#if HAVE_X86
    if (J->vector && vector_ok(J)) {
        Scratch S = {.np = (J->n + 31) / 32 * 32, .nq = (J->n + 15) / 16 * 16};
        const int64_t half = J->d / 2;
        void *blocks[6 + 2 * MAX_TERMS] = {NULL};
        int count = 0;
#define TAKE(field, type, items) (blocks[count++] = S.field = (type *)malloc((size_t)(items) * 4 + 64))
        int ok = TAKE(kp, uint32_t, half * S.np) && TAKE(vp, uint32_t, S.np / 2 * J->d) &&
                 TAKE(qp, uint32_t, S.nq * half) && TAKE(s, float, ROWS * S.np) && TAKE(pp, uint32_t, ROWS * S.np / 2) &&
                 TAKE(acc, float, 4 * (J->kv + 1));
        for (int t = 0; ok && t < J->terms; t++) {
            ok = TAKE(lp[t], float, J->plane[t]) != NULL;
            if (ok && J->column[t]) ok = TAKE(tt[t], float, S.nq * S.np) != NULL;
        }
        if (ok) ok = (blocks[count++] = S.u = malloc((size_t)(S.nq * S.nq) * 4 + 64)) != NULL;
#undef TAKE
        if (ok)
            for (int64_t bh = P->begin; bh < P->end; bh++) plane_avx512(J, bh, &S);
        for (int k = 0; k < count; k++) free(blocks[k]);
        P->failed = !ok;
        return NULL;
    }
#endif
    float *scratch = malloc((size_t)(2 * J->n + 4 * (J->kv + 1)) * sizeof(float));
    P->failed = !scratch;
    for (int64_t bh = P->begin; !P->failed && bh < P->end; bh++) plane_scalar(J, bh, scratch);
    free(scratch);
    return NULL;
}

static cpu_set_t import_cpus; /* the CPUs this process could use when the module was imported */
static int have_cpus;

void ovops_init_cpus(void) { have_cpus = sched_getaffinity(0, sizeof(import_cpus), &import_cpus) == 0; }

int ovops_vector_cpu(void) {
#if HAVE_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bf16");
    }
    return cached;
#else
    return 0;
#endif
}

/* Planes split evenly over `threads`: this thread runs the first part, each helper on a CPU of its own other than
 * this thread's (OpenVINO pins the thread that runs a graph, and a helper would inherit that). 0: done. */
int ovops_run(const Job *J, int threads) {
    enum { MAX_THREADS = 64 };
    int64_t planes = J->bh;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > planes) threads = planes > 0 ? (int)planes : 1;
    Part parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0}, failed = 0, cpu = sched_getcpu(), next = cpu;
    for (int t = 0; t < threads; t++) parts[t] = (Part){J, planes * t / threads, planes * (t + 1) / threads, 0};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    for (int t = 1; t < threads; t++) {
        if (have_cpus && cpu >= 0) {
            int tries = CPU_SETSIZE;
            do next = (next + 1) % CPU_SETSIZE;
            while (!CPU_ISSET(next, &import_cpus) && --tries);
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(next, &one);
            if (next != cpu) pthread_attr_setaffinity_np(&attr, sizeof(one), &one);
        }
        started[t] = pthread_create(&ids[t], &attr, run_part, &parts[t]) == 0;
    }
    pthread_attr_destroy(&attr);
    for (int t = 1; t < threads; t++)
        if (!started[t]) run_part(&parts[t]); /* no thread to be had: run it here */
    run_part(&parts[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        failed |= parts[t].failed;
    }
    return failed | parts[0].failed;
}

