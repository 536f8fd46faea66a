/* y = x @ W.T (+ bias) with W stored in GGML block formats, x and y fp32: the 4/8-bit decode matmul.
 *
 * Formats (32 weights per block along K, blocks laid out row after row, as in a GGUF file):
 *   Q4_0: fp16 d, 16 bytes of nibbles             w = d * (q - 8)      18 bytes / 32 weights
 *   Q4_1: fp16 d, fp16 m, 16 bytes of nibbles     w = d * q + m        20 bytes / 32 weights
 *   Q8_0: fp16 d, 32 int8                         w = d * q            34 bytes / 32 weights
 * Nibbles: byte j holds weight j (low four bits) and weight j + 16 (high four bits).
 *
 * Why x stays fp32: the study's lossless claims compare a method's output with our own AR decoder
 * token for token, and chapter 8 compares formats with the fp32 model they came from. Widening the
 * weights in registers and accumulating in fp32 computes with exactly the stored weights, so the
 * GGUF model here *is* the dense fp32 model up to summation order (llama.cpp instead rounds x to 8
 * bits per block, which changes the model a little). The bytes read per token are the block bytes:
 * 5.6x fewer than fp32 for this model, which is what decode is bound by.
 *
 * Per block: s = sum_i q_i * x_i in vector lanes (q widened to fp32), acc += d * s lane-wise; Q4_1's
 * offset adds m * sum_i x_i, with the block sums of x computed once per call and row.
 *
 * Row invariance, by construction (as in stream_linear.c): every output y[m, n] is the same sequence
 * of fp32 operations whatever M is and wherever row m sits in x, so a token verified in a block of 5
 * or batched with others has the bits it has alone. The AVX-512 and AVX2 builds differ in lane count,
 * so they differ in the last bits from each other, never from themselves.
 *
 * Built twice from this file (-mavx512f... and -mavx2...); Python loads the build this CPU can run.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, F32 = 3 };
/* F32 ("blocks" of 32 plain floats, d = 1): the uncompressed weights through the very same code, so the
 * fused decode step can run the fp32 reference too and chapter 8 compares formats, not engines. */

static inline int block_bytes(int fmt) { return fmt == Q4_0 ? 18 : fmt == Q4_1 ? 20 : fmt == Q8_0 ? 34 : 128; }

static inline float fp16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSET1(s) _mm512_set1_ps(s)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
/* v == -inf ? 0 : e, lane-wise */
#define VMASKINF(v, e) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ), e)
/* Fixed-order horizontal sum: 16 -> 8 -> 4 -> 2 -> 1. */
static inline float vsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}
/* The 32 weights of one block as two 16-lane fp32 vectors (integers: d and m are applied later). */
static inline __attribute__((always_inline)) void expand(int fmt, const uint8_t *qs, vf q[2]) {
    if (fmt == F32) {
        q[0] = _mm512_loadu_ps((const float *)qs);
        q[1] = _mm512_loadu_ps((const float *)qs + 16);
    } else if (fmt == Q8_0) {
        q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
        q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16))));
    } else {
        /* A 16-entry table lookup turns each nibble into its float in one permute (vpermps reads only
         * the low 4 bits of each index): no mask, no int->float conversion (measured ~1.3x faster). */
        const __m512 tbl = fmt == Q4_0
            ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
            : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
        q[0] = _mm512_permutexvar_ps(b, tbl);
        q[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), tbl);
    }
}
#elif defined(__AVX2__)
#define LANES 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSET1(s) _mm256_set1_ps(s)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VMASKINF(v, e) _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ), e)
static inline float vsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}
static inline __attribute__((always_inline)) void expand(int fmt, const uint8_t *qs, vf q[4]) {
    if (fmt == F32) {
        for (int i = 0; i < 4; i++) q[i] = _mm256_loadu_ps((const float *)qs + 8 * i);
    } else if (fmt == Q8_0) {
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i))));
    } else {
        __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
        __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
        __m256i m15 = _mm256_set1_epi32(15), off = _mm256_set1_epi32(fmt == Q4_0 ? 8 : 0);
        __m256i v[4] = {_mm256_and_si256(b0, m15), _mm256_and_si256(b1, m15), _mm256_srli_epi32(b0, 4),
                        _mm256_srli_epi32(b1, 4)};
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtepi32_ps(_mm256_sub_epi32(v[i], off));
    }
}
#else
#error "quant_linear.c needs AVX2 or AVX-512"
#endif

#define NV (QK / LANES)   /* vectors per block */
#define MAX_NW 4          /* weight rows per tile */
#define MAX_R 4           /* x rows per tile */
#ifndef PF_AHEAD
#define PF_AHEAD 8        /* prefetch distance in weight rows (two tiles) */
#endif

/* NW weight rows against R rows of x, over all nb blocks. Each (weight row, x row) output has its own
 * accumulator and the same operation sequence for every NW and R (see the header). */
static inline __attribute__((always_inline)) void tile(
        int fmt, const float *x, ptrdiff_t ldx, const float *xsum, int nb, const uint8_t *w,
        size_t row_bytes, int NW, int R, float out[MAX_NW][MAX_R]) {
    const int bb = block_bytes(fmt), qoff = fmt == Q4_1 ? 4 : fmt == F32 ? 0 : 2;
    vf acc[MAX_NW][MAX_R];
    float macc[MAX_NW][MAX_R];
    for (int j = 0; j < NW; j++)
        for (int r = 0; r < R; r++) { acc[j][r] = VZERO(); macc[j][r] = 0.0f; }
    for (int b = 0; b < nb; b++) {
        vf xv[MAX_R][NV];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < NV; i++) xv[r][i] = VLOAD(x + r * ldx + b * QK + i * LANES);
        for (int j = 0; j < NW; j++) {
            const uint8_t *blk = w + j * row_bytes + (size_t)b * bb;
            /* The next tiles' rows (contiguous after these): software prefetch keeps DRAM busy while
             * this block computes (measured: without it, a cold matrix ran at half its warm speed). */
            _mm_prefetch((const char *)(blk + PF_AHEAD * row_bytes), _MM_HINT_T0); /* never faults */
            vf q[NV];
            expand(fmt, blk + qoff, q);
            vf d = VSET1(fmt == F32 ? 1.0f : fp16(blk)); /* fma(s, 1, acc) is exactly s + acc */
            for (int r = 0; r < R; r++) {
                vf s = VMUL(q[0], xv[r][0]);
                for (int i = 1; i < NV; i++) s = VFMA(q[i], xv[r][i], s);
                acc[j][r] = VFMA(s, d, acc[j][r]);
            }
            if (fmt == Q4_1) {
                float m = fp16(blk + 2);
                for (int r = 0; r < R; r++) macc[j][r] += m * xsum[r * nb + b];
            }
        }
    }
    for (int j = 0; j < NW; j++)
        for (int r = 0; r < R; r++) out[j][r] = vsum(acc[j][r]) + macc[j][r];
}

/* Constant NW, R and fmt per case, so the accumulators live in registers. */
#define CASE(F, NW, R) case (F) * 100 + (NW) * 10 + (R): tile(F, x, ldx, xs, nb, w, rb, NW, R, out); break;
#define CASES_R(F, NW) CASE(F, NW, 1) CASE(F, NW, 2) CASE(F, NW, 3) CASE(F, NW, 4)
#define CASES(F) CASES_R(F, 1) CASES_R(F, 2) CASES_R(F, 3) CASES_R(F, 4)
static void tile_any(int fmt, const float *x, ptrdiff_t ldx, const float *xs, int nb, const uint8_t *w,
                     size_t rb, int NW, int R, float out[MAX_NW][MAX_R]) {
    switch (fmt * 100 + NW * 10 + R) {
        CASES(Q4_0)
        CASES(Q4_1)
        CASES(Q8_0)
        CASES(F32)
        default: break;
    }
}

/* x: (M, K) fp32, row stride ldx; w: (N, K/32 blocks) in format fmt; bias: (N) fp32 or NULL;
 * y: (M, N) fp32. Returns 0, or -1 if K is not a multiple of 32 or memory ran out. */
int quant_linear(int fmt, const float *x, ptrdiff_t ldx, const uint8_t *w, const float *bias, float *y,
                 int M, int K, int N, int nthreads) {
    if (K % QK || fmt < Q4_0 || fmt > F32) return -1;
    const int nb = K / QK;
    const size_t rb = (size_t)nb * block_bytes(fmt);
    float *xsum = NULL;
    if (fmt == Q4_1) {
        /* Block sums of x, left to right: the same for a row whatever else is in x. */
        xsum = malloc(sizeof(float) * (size_t)M * nb + 1);
        if (!xsum) return -1;
        for (int m = 0; m < M; m++)
            for (int b = 0; b < nb; b++) {
                float s = 0.0f;
                for (int i = 0; i < QK; i++) s += x[m * ldx + b * QK + i];
                xsum[(size_t)m * nb + b] = s;
            }
    }
    /* One contiguous, equal share of weight rows per thread (a multiple of 4). */
    int per = (N + nthreads - 1) / nthreads;
    per = (per + MAX_NW - 1) / MAX_NW * MAX_NW;
    int tasks = (N + per - 1) / per;
    _Pragma("omp parallel for num_threads(nthreads) schedule(static, 1)")
    for (int t = 0; t < tasks; t++) {
        int n_end = (t + 1) * per < N ? (t + 1) * per : N;
        for (int n = t * per; n < n_end; n += MAX_NW) {
            int NW = n_end - n < MAX_NW ? n_end - n : MAX_NW;
            /* The NW weight rows (at most 4 x 1.2 KB here) stay in L1 while every tile of x passes. */
            for (int m0 = 0; m0 < M; m0 += MAX_R) {
                int R = M - m0 < MAX_R ? M - m0 : MAX_R;
                float out[MAX_NW][MAX_R];
                tile_any(fmt, x + (ptrdiff_t)m0 * ldx, ldx, xsum ? xsum + (size_t)m0 * nb : NULL, nb,
                         w + (size_t)n * rb, rb, NW, R, out);
                for (int j = 0; j < NW; j++) {
                    float bj = bias ? bias[n + j] : 0.0f;
                    for (int r = 0; r < R; r++) y[(ptrdiff_t)(m0 + r) * N + n + j] = out[j][r] + bj;
                }
            }
        }
    }
    free(xsum);
    return 0;
}

/* out[i, :] = dequantised row ids[i] of w (N rows, K columns), fp32: the embedding lookup and the
 * prefill path (which hands a dequantised matrix to the BLAS GEMM). ids == NULL means rows 0..n-1. */
int quant_dequant_rows(int fmt, const uint8_t *w, int K, const int64_t *ids, int n, float *out, int nthreads) {
    if (K % QK || fmt < Q4_0 || fmt > F32) return -1;
    const int nb = K / QK, bb = block_bytes(fmt);
    const size_t rb = (size_t)nb * bb;
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (n > 64)")
    for (int i = 0; i < n; i++) {
        const uint8_t *row = w + (size_t)(ids ? ids[i] : i) * rb;
        float *o = out + (size_t)i * K;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bb;
            if (fmt == F32) {
                memcpy(o + b * QK, blk, sizeof(float) * QK);
                continue;
            }
            float d = fp16(blk);
            if (fmt == Q8_0) {
                for (int k = 0; k < QK; k++) o[b * QK + k] = d * (float)(int8_t)blk[2 + k];
            } else if (fmt == Q4_0) {
                for (int k = 0; k < QK / 2; k++) {
                    o[b * QK + k] = d * (float)((blk[2 + k] & 15) - 8);
                    o[b * QK + k + 16] = d * (float)((blk[2 + k] >> 4) - 8);
                }
            } else {
                float m = fp16(blk + 2);
                for (int k = 0; k < QK / 2; k++) {
                    o[b * QK + k] = d * (float)(blk[4 + k] & 15) + m;
                    o[b * QK + k + 16] = d * (float)(blk[4 + k] >> 4) + m;
                }
            }
        }
    }
    return 0;
}
