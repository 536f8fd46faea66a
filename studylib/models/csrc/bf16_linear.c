/* y = x @ W.T (+ bias) with W in GGML blocks and x rounded to bf16: bf16 dot products (`--act bf16`).
 *
 * Why: the fp32 kernel (quant_linear.c) widens every weight to fp32 and does one fp32 FMA per weight
 * and row. AVX512-BF16's vdpbf16ps does two multiply-adds per fp32 lane, so a step of several rows
 * costs about half the FMAs. Block weights are small integers (Q4: 0..15 or -8..7, Q8_0: -128..127),
 * exact in bf16, so only x is rounded: a model of its own, closer to the fp32 model than int8 (x keeps
 * 8 significant bits per element instead of 8 bits per block of 32).
 *
 * The arithmetic, per output y[r, n], is one fixed sequence on every path (the canonical definition;
 * the pure-PyTorch reference bf16_linear.reference computes exactly it). All float steps run with
 * denormals flushed (inputs and results), as vdpbf16ps always does; the other paths set MXCSR so.
 *   x rounding:   xb = x rounded to bf16 to nearest, ties to even; a denormal x becomes a signed zero; a
 *                 NaN stays a quiet NaN
 *   per block b of 32 (in block order), with w the block's integer weights as above:
 *       s = 0; for p = 0..15: s = s + xb[2p+1] * w[2p+1]; s = s + xb[2p] * w[2p]
 *           (each product is exact in fp32 (8 x 8 significant bits), each add rounds: this is
 *            vdpbf16ps's order, measured on hardware: odd element first, two roundings)
 *       acc = acc + d * s                               [mul, add: no FMA]
 *       Q4_1: acc = acc + m * sx, with sx = the block's 32 xb summed by halving (v[i] + v[i + h] for
 *             h = 16, 8, 4, 2, 1)
 *   y = acc (+ bias[n])
 * So every path (scalar, AVX2 with FMA, AVX512-BF16) gives the same bits, and a row's result never
 * depends on the other rows of the step (row invariance), by construction.
 *
 * AMX-BF16 is not a path: its tile multiply (TDPBF16PS) sums a tile's products in an order that no
 * sequence of fp32 roundings reproduces (benchmarks/amx_bf16_order.c measures it), so it cannot give
 * the bits the other paths give. AMX machines reach AMX through `--act int8` (exact integer sums).
 *
 * Weight layout (bf16_pack): rows in groups of 16 (zero-padded), per group and block of 32 columns one
 * record  d[16] fp16 | m[16] fp16 (Q4_1 only) | quants, where the quants put column pair p (columns
 * 2p, 2p+1) of the 16 rows side by side, as vdpbf16ps wants them with the rows in its lanes:
 *   Q4_0/Q4_1: byte [p][n] = q(n, 2p) | q(n, 2p + 1) << 4                  (256 bytes)
 *   Q8_0:      byte [p][h][n] = q(n, 2p + h)                              (512 bytes)
 * Bytes per weight are the GGUF's.
 *
 * Built once per path from this file (-DBF_PATH=...); Python loads the build this CPU can run.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if BF_PATH != 0
#include <immintrin.h>
#endif
#include <xmmintrin.h>

/* Paths: 0 scalar, 1 avx2 (fp32 FMA on the exact products), 2 avx512bf16 (vdpbf16ps). */
#ifndef BF_PATH
#define BF_PATH 0
#endif
static const char *const path_names[] = {"scalar", "avx2", "avx512bf16"};
const char *bf_path(void) { return path_names[BF_PATH]; }

#include "packed_blocks.h"

size_t bf_packed_bytes(int fmt, int N, int K) { return packed_bytes(fmt, N, K); }
static inline float bf_to_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t float_to_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* denormal or zero: signed zero */
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The integer weight of (row n, column k) of a record, as the kernels multiply it. */
static inline int weight_at(int fmt, const uint8_t *qd, int n, int k) {
    const int p = k >> 1, h = k & 1;
    if (fmt == Q8_0) return (int8_t)qd[p * 32 + h * 16 + n];
    const int v = h ? qd[p * 16 + n] >> 4 : qd[p * 16 + n] & 15;
    return fmt == Q4_0 ? v - 8 : v;
}

/* GGML blocks (N rows of K/32 blocks) -> the packed layout. Returns 0, or -1 on a bad format/width. */
int bf_pack(int fmt, const uint8_t *w, int N, int K, uint8_t *out) {
    if (K % QK || fmt < Q4_0 || fmt > Q8_0) return -1;
    const int nb = K / QK, bb = fmt == Q4_0 ? 18 : fmt == Q4_1 ? 20 : 34, rec = record_bytes(fmt);
    const int G = (N + GN - 1) / GN;
    memset(out, 0, bf_packed_bytes(fmt, N, K));
    for (int g = 0; g < G; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *r = out + ((size_t)g * nb + b) * rec, *qd = r + qoff(fmt);
            for (int n = 0; n < GN; n++) {
                uint8_t q[QK];
                if (g * GN + n < N) {
                    const uint8_t *blk = w + ((size_t)(g * GN + n) * nb + b) * bb;
                    memcpy(r + 2 * n, blk, 2);
                    if (fmt == Q4_1) memcpy(r + 32 + 2 * n, blk + 2, 2);
                    if (fmt == Q8_0) memcpy(q, blk + 2, QK);
                    else
                        for (int k = 0; k < 16; k++) {
                            const uint8_t byte = blk[(fmt == Q4_1 ? 4 : 2) + k];
                            q[k] = byte & 15;
                            q[k + 16] = byte >> 4;
                        }
                } else /* padding rows: d = 0, and the quants of a zero weight (Q4_0's zero is 8) */
                    memset(q, fmt == Q4_0 ? 8 : 0, QK);
                for (int p = 0; p < 16; p++) {
                    if (fmt == Q8_0) {
                        qd[p * 32 + n] = q[2 * p];
                        qd[p * 32 + 16 + n] = q[2 * p + 1];
                    } else
                        qd[p * 16 + n] = (uint8_t)(q[2 * p] | q[2 * p + 1] << 4);
                }
            }
        }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* x rounding, per row: xb (bf16 bits), xf (the same values as fp32, for the fp32 paths) and per block
 * sx (Q4_1's offset term). The halving sum is element-wise, so the vector and scalar forms agree. */
typedef struct {
    uint16_t *xb;
    float *xf, *sx;
} xr_t;

static void round_row(const float *x, ptrdiff_t ldx, int m, int K, const xr_t *o) {
    const int nb = K / QK;
    const float *xr = x + (ptrdiff_t)m * ldx;
    uint16_t *xb = o->xb + (size_t)m * K;
    float *xf = o->xf ? o->xf + (size_t)m * K : NULL;
    for (int b = 0; b < nb; b++) {
        float v[QK];
#if BF_PATH == 2
        const __m512i expm = _mm512_set1_epi32(0x7f800000), one = _mm512_set1_epi32(1);
        for (int h = 0; h < 2; h++) {
            const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(xr + b * QK + 16 * h));
            const __mmask16 den = _mm512_testn_epi32_mask(u, expm);
            __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                             _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            r = _mm512_mask_mov_epi32(r, den, _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)));
            const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, expm), expm) &
                                  _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffff));
            r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)),
                                                               _mm512_set1_epi32(0x400000)));
            r = _mm512_srli_epi32(r, 16);
            _mm256_storeu_si256((__m256i *)(xb + b * QK + 16 * h), _mm512_cvtepi32_epi16(r));
            const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
            _mm512_storeu_ps(v + 16 * h, f);
        }
        if (xf) memcpy(xf + b * QK, v, sizeof v);
        __m512 a = _mm512_add_ps(_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16));
        __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
        __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
        a4 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));               /* v0+v2, v1+v3 */
        a4 = _mm_add_ss(a4, _mm_shuffle_ps(a4, a4, 1));           /* (v0+v2) + (v1+v3) */
        o->sx[(size_t)m * nb + b] = _mm_cvtss_f32(a4);
#else
        for (int i = 0; i < QK; i++) {
            xb[b * QK + i] = float_to_bf(xr[b * QK + i]);
            v[i] = bf_to_float(xb[b * QK + i]);
        }
        if (xf) memcpy(xf + b * QK, v, sizeof v);
        for (int h = 16; h >= 1; h >>= 1)
            for (int i = 0; i < h; i++) v[i] = v[i] + v[i + h];
        o->sx[(size_t)m * nb + b] = v[0];
#endif
    }
}

/* Exported for tests: the rounding alone. */
void bf_round(const float *x, ptrdiff_t ldx, int M, int K, uint16_t *xb, float *sx) {
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
    xr_t o = {xb, NULL, sx};
    for (int m = 0; m < M; m++) round_row(x, ldx, m, K, &o);
    _mm_setcsr(csr);
}

/* ---------------------------------------------------------------------------------------------- */
/* The scalar path: the canonical sequence, one output at a time.                                   */
static __attribute__((unused)) void group_scalar(int fmt, const xr_t *x, int r0, int R, int K, const uint8_t *wg,
                                                 float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    for (int r = 0; r < R; r++)
        for (int n = 0; n < GN; n++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt);
                const float *xv = x->xf + (size_t)(r0 + r) * K + b * QK;
                float s = 0.0f;
                for (int p = 0; p < 16; p++) {
                    s = s + xv[2 * p + 1] * (float)weight_at(fmt, qd, n, 2 * p + 1);
                    s = s + xv[2 * p] * (float)weight_at(fmt, qd, n, 2 * p);
                }
                uint16_t h;
                memcpy(&h, rp + 2 * n, 2);
                acc = acc + half_to_float(h) * s;
                if (fmt == Q4_1) {
                    memcpy(&h, rp + 32 + 2 * n, 2);
                    acc = acc + half_to_float(h) * x->sx[(size_t)(r0 + r) * nb + b];
                }
            }
            out[r][n] = acc;
        }
}

#if BF_PATH == 1
/* ---------------------------------------------------------------------------------------------- */
/* AVX2: 8 weight rows in the lanes (a group as two halves); each weight widened to fp32 and one FMA
 * per product, which rounds once, as vdpbf16ps does (the product itself is exact).                  */
#define MAXR 4
static inline __attribute__((always_inline)) void half_tile(int fmt, const xr_t *x, int r0, int R, int K,
                                                            const uint8_t *wg, int half, float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    __m256 acc[MAXR];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i lo = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(fmt == Q4_0 ? 8 : 0);
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt);
        __m256 s[MAXR];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_ps();
        for (int p = 0; p < 16; p++) {
            __m256 w0, w1;
            if (fmt == Q8_0) {
                w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qd + p * 32 + 8 * half))));
                w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qd + p * 32 + 16 + 8 * half))));
            } else {
                const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qd + p * 16 + 8 * half)));
                w0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, lo), eight));
                w1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight));
            }
            for (int r = 0; r < R; r++) {
                const float *xv = x->xf + (size_t)(r0 + r) * K + b * QK + 2 * p;
                s[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(xv + 1), w1, s[r]);
                s[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(xv), w0, s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 16 * half)));
        __m256 mm = _mm256_setzero_ps();
        if (fmt == Q4_1) mm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 32 + 16 * half)));
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(d, s[r]));
            if (fmt == Q4_1) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(mm, _mm256_set1_ps(x->sx[(size_t)(r0 + r) * nb + b])));
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out[r] + 8 * half, acc[r]);
}
static void group_simd(int fmt, const xr_t *x, int r0, int R, int K, const uint8_t *wg, float out[][GN]) {
    for (int s0 = 0; s0 < R; s0 += MAXR) {
        const int Rs = R - s0 < MAXR ? R - s0 : MAXR;
        float (*o)[GN] = out + s0;
        const int rr = r0 + s0;
        switch (fmt * 10 + Rs) {
#define C1(F, N) case F * 10 + N: half_tile(F, x, rr, N, K, wg, 0, o); half_tile(F, x, rr, N, K, wg, 1, o); break;
#define CASES(F) C1(F, 1) C1(F, 2) C1(F, 3) C1(F, 4)
            CASES(Q4_0) CASES(Q4_1) CASES(Q8_0)
#undef CASES
#undef C1
            default: break;
        }
    }
}
#endif

#if BF_PATH == 2
/* ---------------------------------------------------------------------------------------------- */
/* AVX512-BF16: the 16 rows of a group in the 16 lanes; per column pair one vdpbf16ps per x row, the
 * pair's weights expanded once for all rows of the tile.                                           */
#define MAXR 8
typedef int32_t __attribute__((may_alias, aligned(2))) i32_alias; /* an x pair: 4 bytes of the bf16 row */
static inline __attribute__((always_inline)) __m512bh expand_pair(int fmt, const uint8_t *qd, int p, __m512i table) {
    if (fmt == Q8_0) {
        const __m512 e = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qd + p * 32))));
        const __m512 o = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qd + p * 32 + 16))));
        /* small integers are exact in bf16: the top half of each fp32 is its bf16; odd in the high word */
        return (__m512bh)_mm512_ternarylogic_epi32(_mm512_castps_si512(o), _mm512_srli_epi32(_mm512_castps_si512(e), 16),
                                                   _mm512_set1_epi32((int)0xffff0000u), 0xe4);
    }
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qd + p * 16)));
    /* word 0 = low nibble (column 2p), word 1 = high nibble (column 2p + 1); then bf16 by table */
    const __m512i idx = _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), _mm512_set1_epi32(0x000f000f));
    return (__m512bh)_mm512_permutexvar_epi16(idx, table);
}
static inline __attribute__((always_inline)) void tile16(int fmt, const xr_t *x, int r0, int R, int K,
                                                         const uint8_t *wg, float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    uint16_t tv[32];
    for (int i = 0; i < 32; i++) tv[i] = float_to_bf((float)(fmt == Q4_0 ? (i & 15) - 8 : (i & 15)));
    const __m512i table = _mm512_loadu_si512(tv);
    __m512 acc[MAXR];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt);
        for (int o = 0; o < 576; o += 64) _mm_prefetch((const char *)(rp + 4 * rec + o), _MM_HINT_T0);
        __m512 s[MAXR];
        for (int r = 0; r < R; r++) s[r] = _mm512_setzero_ps();
        for (int p = 0; p < 16; p++) {
            const __m512bh w = expand_pair(fmt, qd, p, table);
            for (int r = 0; r < R; r++) {
                /* a broadcast straight from memory (a load-port operand, no shuffle-port op) */
                const int32_t x2 = *(const i32_alias *)(x->xb + (size_t)(r0 + r) * K + b * QK + 2 * p);
                s[r] = _mm512_dpbf16_ps(s[r], (__m512bh)_mm512_set1_epi32(x2), w);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        __m512 mm = _mm512_setzero_ps();
        if (fmt == Q4_1) mm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(d, s[r]));
            if (fmt == Q4_1) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(mm, _mm512_set1_ps(x->sx[(size_t)(r0 + r) * nb + b])));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out[r], acc[r]);
}
static void group_simd(int fmt, const xr_t *x, int r0, int R, int K, const uint8_t *wg, float out[][GN]) {
    for (int s0 = 0; s0 < R; s0 += MAXR) {
        const int Rs = R - s0 < MAXR ? R - s0 : MAXR;
        float (*o)[GN] = out + s0;
        const int rr = r0 + s0;
        switch (fmt * 10 + Rs) {
#define C1(F, N) case F * 10 + N: tile16(F, x, rr, N, K, wg, o); break;
#define CASES(F) C1(F, 1) C1(F, 2) C1(F, 3) C1(F, 4) C1(F, 5) C1(F, 6) C1(F, 7) C1(F, 8)
            CASES(Q4_0) CASES(Q4_1) CASES(Q8_0)
#undef CASES
#undef C1
            default: break;
        }
    }
}
#endif

/* ---------------------------------------------------------------------------------------------- */
#define RT 64 /* x rows per pass over a group */

static int run(int fmt, const float *x, ptrdiff_t ldx, const xr_t *xr, const uint8_t *wp, const float *bias,
               float *y, int M, int K, int N, int nthreads) {
    const int nb = K / QK, rec = record_bytes(fmt), G = (N + GN - 1) / GN;
    const size_t grp_bytes = (size_t)nb * rec;
    int per = (G + nthreads - 1) / nthreads, tasks = per ? (G + per - 1) / per : 0;
    int rc = 0;
    _Pragma("omp parallel num_threads(nthreads) reduction(|: rc)")
    {
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ: the definition's denormal rule, on every path */
    _Pragma("omp for schedule(static)")
    for (int m = 0; m < M; m++) round_row(x, ldx, m, K, xr);
    _Pragma("omp for schedule(static, 1)")
    for (int t = 0; t < tasks; t++) {
        float (*out)[GN] = malloc(sizeof(float) * GN * RT);
        if (!out) { rc |= 1; continue; }
        const int g_end = (t + 1) * per < G ? (t + 1) * per : G;
        for (int g = t * per; g < g_end; g++) {
            const uint8_t *wg = wp + (size_t)g * grp_bytes;
            for (int m0 = 0; m0 < M; m0 += RT) {
                const int R = M - m0 < RT ? M - m0 : RT;
#if BF_PATH == 0
                group_scalar(fmt, xr, m0, R, K, wg, out);
#else
                group_simd(fmt, xr, m0, R, K, wg, out);
#endif
                const int nn = N - g * GN < GN ? N - g * GN : GN;
                float bg[GN] = {0};
                if (bias) memcpy(bg, bias + g * GN, sizeof(float) * nn);
                for (int r = 0; r < R; r++) {
                    float *yr = y + (size_t)(m0 + r) * N + g * GN;
                    for (int n = 0; n < nn; n++) yr[n] = out[r][n] + bg[n];
                }
            }
        }
        free(out);
    }
    _mm_setcsr(csr);
    }
    return rc ? -1 : 0;
}

/* x: (M, K) fp32, row stride ldx; wp: packed (bf_pack) weight of N rows; bias: (N) fp32 or NULL;
 * y: (M, N) fp32. Returns 0, or -1 (K not a multiple of 32, bad format, out of memory). */
int bf_linear(int fmt, const float *x, ptrdiff_t ldx, const uint8_t *wp, const float *bias, float *y,
              int M, int K, int N, int nthreads) {
    if (K % QK || fmt < Q4_0 || fmt > Q8_0 || M < 0 || N < 0) return -1;
    if (M == 0 || N == 0) return 0;
    const int nb = K / QK;
    xr_t xr = {malloc(sizeof(uint16_t) * (size_t)M * K + 64), BF_PATH == 2 ? NULL : malloc(sizeof(float) * (size_t)M * K),
               malloc(sizeof(float) * (size_t)M * nb)};
    int rc = -1;
    if (xr.xb && xr.sx && (BF_PATH == 2 || xr.xf))
        rc = run(fmt, x, ldx, &xr, wp, bias, y, M, K, N, nthreads < 1 ? 1 : nthreads);
    free(xr.xb); free(xr.xf); free(xr.sx);
    return rc;
}
