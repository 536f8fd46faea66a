/* y = x @ W.T (+ bias) with W in GGML blocks and x rounded to int8 per 32-block: integer dot products.
 *
 * Why: the fp32 kernel (quant_linear.c) widens every weight to fp32 and multiplies in fp32, so from
 * two rows on a step is bound by fp32 FMAs, not by reading the weights. Rounding each row of x to
 * int8 per block of 32, with an fp32 scale (llama.cpp's scheme for Q4/Q8 weights), turns the inner
 * products into integer dot-product instructions: AVX2 vpmaddubsw, AVX-VNNI / AVX512-VNNI vpdpbusd,
 * AMX-INT8 tiles. This is a model of its own (`--act int8`), not the fp32 model.
 *
 * The arithmetic, per output y[r, n], is one fixed sequence on every path (the canonical definition;
 * the pure-PyTorch reference int8_linear.reference computes exactly it):
 *   x rounding, per row r and block b:  dx = amax|x| / 127;  q = rne(x / dx) = rne(x * (1 / dx)), clamped
 *      to [-127, 127] (q = 0 where amax = 0);  Sq = sum q (int);  sx = dx * (float)Sq
 *   per block, in block order:           s = sum_k qw * q (exact int32; Q4_0: sum_k nib * q - 8 Sq)
 *                                        acc = acc + (dw * dx) * (float)s    [mul, mul, add: no FMA]
 *                                        Q4_1: acc = acc + mw * sx
 *   y = acc (+ bias[n])
 * Integer sums are exact whatever the instruction or order, and the float steps are element-wise, so
 * every path (scalar, AVX2, AVX-VNNI, AVX512-VNNI, AMX) gives the same bits, and a row's result
 * never depends on the other rows in the step (row invariance), by construction.
 *
 * Weight layout ("packed", made once per weight by i8_pack): rows in groups of 16 (zero-padded), and
 * per group, for each block of 32 columns, one record:
 *   d[16] fp16 | m[16] fp16 (Q4_1 only) | quants
 * quants, logically U[c][n][j] = weight (row n, column 4c + j), c < 8, n < 16, j < 4: one 64-byte row
 * per c holds 4 consecutive columns of each of the 16 rows. That is the operand a vpdpbusd with the
 * 16 rows in its lanes wants, and exactly an AMX B tile (8 rows x 64 bytes). Q8_0 stores U (512 bytes,
 * int8); Q4_0/Q4_1 store P[c] = U[c] | U[c + 4] << 4 (256 bytes). Bytes per weight are the GGUF's.
 *
 * Built once per path from this file (-DI8_PATH=...); Python loads the build this CPU can run.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if I8_PATH != 0
#include <immintrin.h>
#endif
#if I8_PATH == 4
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Paths: 0 scalar, 1 avx2, 2 avxvnni, 3 avx512vnni, 4 amx (AMX-INT8 tiles from I8_AMX_MIN_ROWS rows, else 3). */
#ifndef I8_PATH
#define I8_PATH 0
#endif
static const char *const path_names[] = {"scalar", "avx2", "avxvnni", "avx512vnni", "amx"};
const char *i8_path(void) { return path_names[I8_PATH]; }

#include "packed_blocks.h"

size_t i8_packed_bytes(int fmt, int N, int K) { return packed_bytes(fmt, N, K); }

/* GGML blocks (N rows of K/32 blocks) -> the packed layout. Returns 0, or -1 on a bad format/width. */
int i8_pack(int fmt, const uint8_t *w, int N, int K, uint8_t *out) {
    if (K % QK || fmt < Q4_0 || fmt > Q8_0) return -1;
    const int nb = K / QK, bb = fmt == Q4_0 ? 18 : fmt == Q4_1 ? 20 : 34, rec = record_bytes(fmt);
    const int G = (N + GN - 1) / GN;
    memset(out, 0, i8_packed_bytes(fmt, N, K));
    for (int g = 0; g < G; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *r = out + ((size_t)g * nb + b) * rec, *qd = r + qoff(fmt);
            for (int n = 0; n < GN && g * GN + n < N; n++) {
                const uint8_t *blk = w + ((size_t)(g * GN + n) * nb + b) * bb;
                memcpy(r + 2 * n, blk, 2);                       /* d */
                if (fmt == Q4_1) memcpy(r + 32 + 2 * n, blk + 2, 2); /* m */
                uint8_t q[QK];
                if (fmt == Q8_0) memcpy(q, blk + 2, QK);
                else
                    for (int k = 0; k < 16; k++) {
                        const uint8_t byte = blk[(fmt == Q4_1 ? 4 : 2) + k];
                        q[k] = byte & 15;
                        q[k + 16] = byte >> 4;
                    }
                for (int c = 0; c < 8; c++)
                    for (int j = 0; j < 4; j++) {
                        const uint8_t v = q[4 * c + j];
                        if (fmt == Q8_0) qd[c * 64 + n * 4 + j] = v;
                        else qd[(c & 3) * 64 + n * 4 + j] |= (uint8_t)(c < 4 ? v : v << 4);
                    }
            }
        }
    return 0;
}

/* The activations of one step, rounded: q (M, K) int8, and per (row, block) dx, Sq and sx. */
typedef struct {
    int8_t *q;
    uint8_t *qu; /* q + 128 as uint8 (Q8_0 weights on the VNNI paths: vpdpbusd wants one unsigned side) */
    float *dx, *sx;
    int32_t *sq;
    /* AMX only (else NULL): x tiled, qa[(t * nb + b) * 512 + r * 32 + k] = q[16 t + r][32 b + k] (rows past M
     * zero), and its scales beside it, dxa / sxa[(t * nb + b) * 16 + r] */
    int8_t *qa;
    float *dxa, *sxa;
} xq_t;

/* One row. The same bits on every build (-ffp-contract=off; rne is nearbyintf in the default
 * rounding mode, roundscale/round_ps to nearest in vectors; amax and the integer sums are exact in any
 * order). O(M K), but with N/16 groups per x element it is not small beside the products: vectorised. */
static inline void quantize_block(const float *xb, int8_t *q, uint8_t *qu, float *dxo, int32_t *sqo, float *sxo) {
#if I8_PATH >= 3
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
#else
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) {
        const float a = fabsf(xb[i]);
        amax = a > amax ? a : amax;
    }
#endif
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
#if I8_PATH >= 3
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), vid = _mm512_set1_ps(id);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(x0, vid), rnd), lo), hi));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(x1, vid), rnd), lo), hi));
    const __m128i b0 = _mm512_cvtepi32_epi8(i0), b1 = _mm512_cvtepi32_epi8(i1);
    _mm_storeu_si128((__m128i *)q, b0);
    _mm_storeu_si128((__m128i *)(q + 16), b1);
    if (qu) {
        const __m128i flip = _mm_set1_epi8((char)0x80);
        _mm_storeu_si128((__m128i *)qu, _mm_xor_si128(b0, flip));
        _mm_storeu_si128((__m128i *)(qu + 16), _mm_xor_si128(b1, flip));
    }
    sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
#else
    for (int i = 0; i < QK; i++) {
        float v = nearbyintf(xb[i] * id);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = (int8_t)v;
        sum += q[i];
        if (qu) qu[i] = (uint8_t)(q[i] + 128);
    }
#endif
    *dxo = d;
    *sqo = sum;
    *sxo = d * (float)sum;
}
static void quantize_row(const float *x, ptrdiff_t ldx, int m, int K, const xq_t *o) {
    const int nb = K / QK;
    for (int b = 0; b < nb; b++) {
        const size_t i = (size_t)m * nb + b, at = (size_t)m * K + b * QK;
        quantize_block(x + (ptrdiff_t)m * ldx + b * QK, o->q + at, o->qu ? o->qu + at : NULL, o->dx + i, o->sq + i,
                       o->sx + i);
        if (o->qa) {
            const size_t tb = (size_t)(m / 16) * nb + b;
            memcpy(o->qa + tb * 512 + (m % 16) * QK, o->q + at, QK);
            o->dxa[tb * 16 + m % 16] = o->dx[i];
            o->sxa[tb * 16 + m % 16] = o->sx[i];
        }
    }
}

/* Exported for tests: the rounding alone. */
void i8_quantize(const float *x, ptrdiff_t ldx, int M, int K, int8_t *q, float *dx, int32_t *sq, float *sx) {
    xq_t o = {q, NULL, dx, sx, sq, NULL, NULL, NULL};
    for (int m = 0; m < M; m++) quantize_row(x, ldx, m, K, &o);
}

/* ---------------------------------------------------------------------------------------------- */
/* The scalar reference path: the canonical sequence, one output at a time.                        */
static __attribute__((unused)) void group_scalar(int fmt, const xq_t *x, int r0, int R, int K, const uint8_t *wg, float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    for (int r = 0; r < R; r++)
        for (int n = 0; n < GN; n++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt);
                const int8_t *q = x->q + (size_t)(r0 + r) * K + b * QK;
                int32_t s = 0;
                for (int c = 0; c < 8; c++)
                    for (int j = 0; j < 4; j++) {
                        int wv;
                        if (fmt == Q8_0) wv = (int8_t)qd[c * 64 + n * 4 + j];
                        else wv = c < 4 ? qd[c * 64 + n * 4 + j] & 15 : qd[(c - 4) * 64 + n * 4 + j] >> 4;
                        s += wv * q[4 * c + j];
                    }
                const size_t xi = (size_t)(r0 + r) * nb + b;
                if (fmt == Q4_0) s -= 8 * x->sq[xi];
                uint16_t h;
                memcpy(&h, rp + 2 * n, 2);
                const float t = half_to_float(h) * x->dx[xi];
                acc = acc + t * (float)s;
                if (fmt == Q4_1) {
                    memcpy(&h, rp + 32 + 2 * n, 2);
                    acc = acc + half_to_float(h) * x->sx[xi];
                }
            }
            out[r][n] = acc;
        }
}

#if I8_PATH == 1 || I8_PATH == 2
/* ---------------------------------------------------------------------------------------------- */
/* 256-bit paths: 8 weight rows in the lanes, so a group is done as two halves of 8.                */
#define MAXR8 4
static inline __m256i dot4(__m256i acc, __m256i w, __m256i xb, int fmt) {
#if I8_PATH == 2
    (void)fmt;
    return _mm256_dpbusd_avx_epi32(acc, w, xb); /* w unsigned (nibbles, or |w| for Q8_0), x signed */
#else
    (void)fmt;
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, xb), _mm256_set1_epi16(1)));
#endif
}
/* Halves h0 .. h1 - 1 of a group (8 weight rows each) for R rows of x. Both halves in one pass over the
 * blocks where R is small: the group then streams from memory once instead of twice (the second pass had
 * re-read it from L2): about 9% off a one-row call and 11% off two rows on an AVX2 EPYC
 * (benchmarks/int8_kernel_bytes.py). Each
 * accumulator sees its blocks in the same order either way, so the bits do not change. */
static inline __attribute__((always_inline)) void half_tile(int fmt, const xq_t *x, int r0, int R, int K,
                                                            const uint8_t *wg, int h0, int h1, float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    __m256 accs[2][MAXR8];
    for (int h = h0; h < h1; h++)
        for (int r = 0; r < R; r++) accs[h][r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++)
    for (int half = h0; half < h1; half++) {
        __m256 *acc = accs[half];
        const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt) + 32 * half;
        __m256i w[8];
        if (fmt == Q8_0) {
            for (int c = 0; c < 8; c++) w[c] = _mm256_loadu_si256((const __m256i *)(qd + 64 * c));
        } else {
            const __m256i lo = _mm256_set1_epi8(15);
            for (int c = 0; c < 4; c++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)(qd + 64 * c));
                w[c] = _mm256_and_si256(p, lo);
                w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), lo);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 16 * half)));
        __m256 mm = _mm256_setzero_ps();
        if (fmt == Q4_1) mm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 32 + 16 * half)));
        __m256i wa[8];
        if (fmt == Q8_0)
            for (int c = 0; c < 8; c++) wa[c] = _mm256_abs_epi8(w[c]);
        for (int r = 0; r < R; r++) {
            const int8_t *q = x->q + (size_t)(r0 + r) * K + b * QK;
            __m256i s = _mm256_setzero_si256();
#if I8_PATH == 1
            if (fmt != Q8_0) {
                /* nibble x int8 pairs stay within int16 (8 x 2 x 15 x 127 < 32767): add in int16, widen once */
                __m256i s16 = _mm256_setzero_si256();
                for (int c = 0; c < 8; c++) {
                    int32_t x4;
                    memcpy(&x4, q + 4 * c, 4);
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(x4)));
                }
                s = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            } else
#endif
            for (int c = 0; c < 8; c++) {
                int32_t x4;
                memcpy(&x4, q + 4 * c, 4);
                const __m256i xb = _mm256_set1_epi32(x4);
                /* Q8_0: |w| (unsigned) times x carrying w's sign: |128 x 127| x 2 fits int16 too. */
                s = fmt == Q8_0 ? dot4(s, wa[c], _mm256_sign_epi8(xb, w[c]), fmt) : dot4(s, w[c], xb, fmt);
            }
            const size_t xi = (size_t)(r0 + r) * nb + b;
            if (fmt == Q4_0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * x->sq[xi]));
            const __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(x->dx[xi]));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(s)));
            if (fmt == Q4_1) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(mm, _mm256_set1_ps(x->sx[xi])));
        }
    }
    for (int h = h0; h < h1; h++)
        for (int r = 0; r < R; r++) _mm256_storeu_ps(out[r] + 8 * h, accs[h][r]);
}
static void group_simd(int fmt, const xq_t *x, int r0, int R, int K, const uint8_t *wg, float out[][GN]) {
    for (int s0 = 0; s0 < R; s0 += MAXR8) {
        const int Rs = R - s0 < MAXR8 ? R - s0 : MAXR8;
        float (*o)[GN] = out + s0;
        const int rr = r0 + s0;
        switch (fmt * 10 + Rs) {
#define CASES(F) \
    case F * 10 + 1: half_tile(F, x, rr, 1, K, wg, 0, 2, o); break; \
    case F * 10 + 2: half_tile(F, x, rr, 2, K, wg, 0, 2, o); break; \
    case F * 10 + 3: half_tile(F, x, rr, 3, K, wg, 0, 1, o); half_tile(F, x, rr, 3, K, wg, 1, 2, o); break; \
    case F * 10 + 4: half_tile(F, x, rr, 4, K, wg, 0, 1, o); half_tile(F, x, rr, 4, K, wg, 1, 2, o); break;
            CASES(Q4_0) CASES(Q4_1) CASES(Q8_0)
#undef CASES
            default: break;
        }
    }
}
#endif

#if I8_PATH >= 3
/* ---------------------------------------------------------------------------------------------- */
/* AVX-512 VNNI: the 16 rows of a group in the 16 lanes of one vector.                               */
#define MAXR16 8
static inline __attribute__((always_inline)) void tile16(int fmt, const xq_t *x, int r0, int R, int K,
                                                         const uint8_t *wg, float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    __m512 acc[MAXR16];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = wg + (size_t)b * rec, *qd = rp + qoff(fmt);
        for (int o = 0; o < 320; o += 64) /* the stream four records ahead (a prefetch never faults) */
            _mm_prefetch((const char *)(rp + 4 * rec + o), _MM_HINT_T0);
        __m512i w[8], corr = _mm512_setzero_si512();
        if (fmt == Q8_0) {
            for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(qd + 64 * c);
            /* x is fed as q + 128 (unsigned): subtract 128 * sum_k w, once per block for all rows. */
            for (int c = 0; c < 8; c++) corr = _mm512_dpbusd_epi32(corr, _mm512_set1_epi8((char)0x80), w[c]);
        } else {
            const __m512i lo = _mm512_set1_epi8(15);
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_loadu_si512(qd + 64 * c);
                w[c] = _mm512_and_si512(p, lo);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        __m512 mm = _mm512_setzero_ps();
        if (fmt == Q4_1) mm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
        for (int r = 0; r < R; r++) {
            /* Two independent chains of dot products (integer sums: the split changes no bit). */
            __m512i s, s2 = _mm512_setzero_si512();
            s = _mm512_setzero_si512();
            if (fmt == Q8_0) {
                const uint8_t *qu = x->qu + (size_t)(r0 + r) * K + b * QK;
                for (int c = 0; c < 8; c += 2) {
                    int32_t x4, y4;
                    memcpy(&x4, qu + 4 * c, 4);
                    memcpy(&y4, qu + 4 * c + 4, 4);
                    s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(x4), w[c]);
                    s2 = _mm512_dpbusd_epi32(s2, _mm512_set1_epi32(y4), w[c + 1]);
                }
                s = _mm512_sub_epi32(_mm512_add_epi32(s, s2), corr);
            } else {
                const int8_t *q = x->q + (size_t)(r0 + r) * K + b * QK;
                for (int c = 0; c < 8; c += 2) {
                    int32_t x4, y4;
                    memcpy(&x4, q + 4 * c, 4);
                    memcpy(&y4, q + 4 * c + 4, 4);
                    s = _mm512_dpbusd_epi32(s, w[c], _mm512_set1_epi32(x4));
                    s2 = _mm512_dpbusd_epi32(s2, w[c + 1], _mm512_set1_epi32(y4));
                }
                s = _mm512_add_epi32(s, s2);
            }
            const size_t xi = (size_t)(r0 + r) * nb + b;
            if (fmt == Q4_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * x->sq[xi]));
            const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(x->dx[xi]));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(t, _mm512_cvtepi32_ps(s)));
            if (fmt == Q4_1) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(mm, _mm512_set1_ps(x->sx[xi])));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out[r], acc[r]);
}
static void group_simd(int fmt, const xq_t *x, int r0, int R, int K, const uint8_t *wg, float out[][GN]) {
    for (int s0 = 0; s0 < R; s0 += MAXR16) {
        const int Rs = R - s0 < MAXR16 ? R - s0 : MAXR16;
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

#if I8_PATH == 4
/* ---------------------------------------------------------------------------------------------- */
/* AMX-INT8. Per block of 32 columns, one tile multiply gives a 16 x 16 tile of exact int32 sums (16 rows
 * of x by a group's 16 weight rows); the float steps are the same element-wise ones as tile16's.
 *
 * Why this shape (measured: the first version, one 16 x 16 tile combined right after its multiply, ran at
 * VNNI's speed or slower, because the tile unit idled while the vector ports did each block's float steps
 * and then waited on the store): a micro-kernel holds 2 x 2 C tiles (two row tiles of x against two weight
 * groups), so each A and B tile loaded feeds two multiplies, and the float steps of each tile trail its
 * multiply by one block, read from a double-buffered store, so the vector ports combine block b - 1 while
 * the tile unit multiplies block b (llama.cpp's AMX kernel keeps its combine off the tile unit's path the
 * same way; its arithmetic differs, so only the structure is shared). x comes tiled (16 rows x 32 bytes
 * contiguous per row tile and block) with its scales beside it, one cache line per (row tile, block).
 *
 * Bits: the integer sums are exact; every output still sees acc = 0, then acc = acc + (d * dx) * s and,
 * for Q4_1, acc = acc + m * sx, blocks in order: tile16's sequence. Q4_0 feeds nibble - 8 as signed bytes
 * (dpbssd), and sum (n - 8) q == sum n q - 8 Sq exactly. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tilecfg_t;

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int amx_ready = 0;
int i8_amx_init(void) { /* Linux hands out AMX state only on request; once per process */
    if (!amx_ready) amx_ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return amx_ready == 1 ? 0 : -1;
}
/* tile registers: tmm0/1 B (weight group j), tmm2/3 A (row tile i), tmm4..7 C (i, j) = 4 + 2 i + j */
static void amx_config(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int j = 0; j < 2; j++) { cfg.rows[j] = 8; cfg.colsb[j] = 64; }         /* B: 8 x (16 rows x 4 bytes) */
    for (int i = 0; i < 2; i++) { cfg.rows[2 + i] = 16; cfg.colsb[2 + i] = 32; } /* A: 16 rows x 32 int8 */
    for (int c = 0; c < 4; c++) { cfg.rows[4 + c] = 16; cfg.colsb[4 + c] = 64; } /* C: 16 x 16 int32 */
    _tile_loadconfig(&cfg);
}

typedef struct { /* per thread, 64-byte aligned: about 14 KB, so it stays in L1 beside the tiles' operands */
    uint8_t bu[2][2][512];    /* B tiles per parity (block b & 1) and group, nibbles widened to bytes */
    int32_t cb[2][4][16][16]; /* C tiles per parity (block b & 1) and tile */
    float acc[4][16][16];     /* fp32 accumulators per tile */
} amx_scratch_t;

static inline void amx_unpack(int fmt, const uint8_t *qd, uint8_t *dst) {
    const __m512i lo = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    for (int c = 0; c < 4; c++) {
        const __m512i p = _mm512_loadu_si512(qd + 64 * c);
        __m512i a = _mm512_and_si512(p, lo), h = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo);
        if (fmt == Q4_0) { a = _mm512_sub_epi8(a, eight); h = _mm512_sub_epi8(h, eight); }
        _mm512_store_si512(dst + 64 * c, a);
        _mm512_store_si512(dst + 64 * (c + 4), h);
    }
}

/* One tile's float steps for block b (rows < R of row tile t), from its int32 sums. */
static inline __attribute__((always_inline)) void amx_combine(int fmt, const xq_t *x, int t, int nb, int b, int R,
                                                              const uint8_t *rp, const int32_t c[16][16],
                                                              float acc[16][16]) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
    __m512 mm = _mm512_setzero_ps();
    if (fmt == Q4_1) mm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
    const size_t base = ((size_t)t * nb + b) * 16;
    for (int r = 0; r < R; r++) {
        const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c[r]));
        const __m512 tt = _mm512_mul_ps(d, _mm512_set1_ps(x->dxa[base + r]));
        __m512 a = _mm512_add_ps(_mm512_load_ps(acc[r]), _mm512_mul_ps(tt, s));
        if (fmt == Q4_1) a = _mm512_add_ps(a, _mm512_mul_ps(mm, _mm512_set1_ps(x->sxa[base + r])));
        _mm512_store_ps(acc[r], a);
    }
}

/* Row tiles t0 .. t0 + nA - 1 (R0, R1 valid rows of 16) against the groups wg[0 .. nB - 1] (nA, nB in 1..2);
 * out[j][16 i + r][n]: row 16 (t0 + i) + r of x against row n of group j. */
static inline __attribute__((always_inline)) void amx_kernel(int fmt, const xq_t *x, int t0, int nA, int R0, int R1,
                                                             int nb, const uint8_t *const wg[2], int nB,
                                                             amx_scratch_t *sc, float out[2][32][GN]) {
    const int rec = record_bytes(fmt), Ri[2] = {R0, R1};
    memset(sc->acc, 0, sizeof sc->acc);
    for (int b = 0; b <= nb; b++) {
        const int p = b & 1, q = p ^ 1;
        if (b < nb) {
            const uint8_t *bt[2] = {NULL, NULL};
            for (int j = 0; j < nB; j++) {
                const uint8_t *rp = wg[j] + (size_t)b * rec, *qd = rp + qoff(fmt);
                for (int o = 0; o < 320; o += 64) /* the stream four records ahead (a prefetch never faults) */
                    _mm_prefetch((const char *)(rp + 4 * rec + o), _MM_HINT_T0);
                if (fmt == Q8_0) bt[j] = qd;
                else {
                    amx_unpack(fmt, qd, sc->bu[0][j]);
                    bt[j] = sc->bu[0][j];
                }
            }
            /* tile numbers must be literals (they are encoded in the instruction) */
            _tile_loadd(0, bt[0], 64);
            if (nB > 1) _tile_loadd(1, bt[1], 64);
            _tile_loadd(2, x->qa + ((size_t)t0 * nb + b) * 512, 32);
            if (nA > 1) _tile_loadd(3, x->qa + ((size_t)(t0 + 1) * nb + b) * 512, 32);
        }
        /* per tile: multiply block b, combine the same tile's block b - 1 meanwhile, then store block b.
         * TILE(I, J, C, A, B): row tile I, group J, in tiles C = 4 + 2 I + J, A = 2 + I, B = J. */
#define TILE(I, J, C, A, B)                                                                                      \
        if ((I) < nA && (J) < nB) {                                                                              \
            if (b < nb) {                                                                                        \
                _tile_zero(C);                                                                                   \
                if (fmt == Q4_1) _tile_dpbsud(C, A, B);                                                          \
                else _tile_dpbssd(C, A, B);                                                                      \
            }                                                                                                    \
            if (b > 0)                                                                                           \
                amx_combine(fmt, x, t0 + (I), nb, b - 1, Ri[I], wg[J] + (size_t)(b - 1) * rec,                   \
                            (const int32_t(*)[16])sc->cb[q][2 * (I) + (J)], sc->acc[2 * (I) + (J)]);             \
            if (b < nb) _tile_stored(C, sc->cb[p][2 * (I) + (J)], 64);                                           \
        }
        TILE(0, 0, 4, 2, 0) TILE(1, 0, 6, 3, 0) TILE(0, 1, 5, 2, 1) TILE(1, 1, 7, 3, 1)
#undef TILE
    }
    for (int i = 0; i < nA; i++)
        for (int j = 0; j < nB; j++)
            for (int r = 0; r < Ri[i]; r++) memcpy(out[j][16 * i + r], sc->acc[2 * i + j][r], sizeof(float) * GN);
}
static void amx_groups(int fmt, const xq_t *x, int M, int nb, const uint8_t *const wg[2], int nB, amx_scratch_t *sc,
                       float out[2][32][GN], const float *bias, float *y, int N, int g) {
    for (int m0 = 0; m0 < M; m0 += 32) {
        const int R = M - m0 < 32 ? M - m0 : 32, R0 = R < 16 ? R : 16, R1 = R - R0;
        switch (fmt) { /* one specialised copy per format: the format tests leave the inner loops */
            case Q4_0: amx_kernel(Q4_0, x, m0 / 16, R1 ? 2 : 1, R0, R1, nb, wg, nB, sc, out); break;
            case Q4_1: amx_kernel(Q4_1, x, m0 / 16, R1 ? 2 : 1, R0, R1, nb, wg, nB, sc, out); break;
            default: amx_kernel(Q8_0, x, m0 / 16, R1 ? 2 : 1, R0, R1, nb, wg, nB, sc, out); break;
        }
        for (int j = 0; j < nB; j++) {
            const int gj = g + j, nn = N - gj * GN < GN ? N - gj * GN : GN;
            float bg[GN] = {0};
            if (bias) memcpy(bg, bias + gj * GN, sizeof(float) * nn);
            for (int r = 0; r < R; r++) { /* element-wise, as on the other paths */
                float *yr = y + (size_t)(m0 + r) * N + gj * GN;
                for (int n = 0; n < nn; n++) yr[n] = out[j][r][n] + bg[n];
            }
        }
    }
}

/* Steps of at most 16 rows (verification windows, trees, small batches): one row tile, configured to the step's
 * R rows, so a multiply works and a C tile stores R rows, not 16; and the fp32 accumulators live in registers
 * (R and the group count are compile-time), so a block's combine is R loads of int32 sums and the float steps,
 * with no accumulator traffic through L1. Two groups per pass while R <= 8 (2 R accumulators), one beyond.
 * The same float sequence as amx_combine, element for element, so the same bits. */
static void amx_config_rows(int R) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int j = 0; j < 2; j++) { cfg.rows[j] = 8; cfg.colsb[j] = 64; }     /* B: 8 x (16 rows x 4 bytes) */
    cfg.rows[2] = (uint8_t)R; cfg.colsb[2] = 32;                            /* A: R rows x 32 int8 */
    for (int c = 0; c < 2; c++) { cfg.rows[4 + c] = (uint8_t)R; cfg.colsb[4 + c] = 64; } /* C: R x 16 int32 */
    _tile_loadconfig(&cfg);
}
static inline __attribute__((always_inline)) void amx_small(int fmt, const xq_t *x, int R, int nB, int nb,
                                                            const uint8_t *const wg[2], amx_scratch_t *sc,
                                                            const float *bias, float *y, int N, int g) {
    const int rec = record_bytes(fmt);
    __m512 acc[2][16];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) { acc[0][r] = _mm512_setzero_ps(); acc[1][r] = _mm512_setzero_ps(); }
    /* B operands one block ahead: block b + 1 is unpacked (into the other half of bu) while block b's tiles
     * load, so a tile load never waits on stores just issued. */
    const uint8_t *bt[2][2] = {{NULL, NULL}, {NULL, NULL}};
#define AMX_STAGE(BB)                                                                                            \
    for (int j = 0; j < nB; j++) {                                                                               \
        const uint8_t *rp = wg[j] + (size_t)(BB) * rec, *qd = rp + qoff(fmt);                                    \
        for (int o = 0; o < 320; o += 64) /* the stream four records ahead (a prefetch never faults) */          \
            _mm_prefetch((const char *)(rp + 4 * rec + o), _MM_HINT_T0);                                         \
        if (fmt == Q8_0) bt[(BB) & 1][j] = qd;                                                                   \
        else {                                                                                                   \
            amx_unpack(fmt, qd, sc->bu[(BB) & 1][j]);                                                            \
            bt[(BB) & 1][j] = sc->bu[(BB) & 1][j];                                                               \
        }                                                                                                        \
    }
    AMX_STAGE(0)
    for (int b = 0; b <= nb; b++) {
        const int p = b & 1, q = p ^ 1;
        if (b < nb) {
            _tile_loadd(2, x->qa + (size_t)b * 512, 32);
            _tile_loadd(0, bt[p][0], 64);
            _tile_zero(4);
            if (fmt == Q4_1) _tile_dpbsud(4, 2, 0);
            else _tile_dpbssd(4, 2, 0);
            if (nB > 1) {
                _tile_loadd(1, bt[p][1], 64);
                _tile_zero(5);
                if (fmt == Q4_1) _tile_dpbsud(5, 2, 1);
                else _tile_dpbssd(5, 2, 1);
            }
            if (b + 1 < nb) { AMX_STAGE(b + 1) }
        }
        if (b > 0) { /* block b - 1's float steps while the tile unit multiplies block b */
            const float *dxa = x->dxa + (size_t)(b - 1) * 16, *sxa = x->sxa + (size_t)(b - 1) * 16;
            for (int j = 0; j < nB; j++) {
                const uint8_t *rp = wg[j] + (size_t)(b - 1) * rec;
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
                __m512 mm = _mm512_setzero_ps();
                if (fmt == Q4_1) mm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
#pragma GCC unroll 16
                for (int r = 0; r < R; r++) {
                    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sc->cb[q][j][r]));
                    const __m512 tt = _mm512_mul_ps(d, _mm512_set1_ps(dxa[r]));
                    __m512 a = _mm512_add_ps(acc[j][r], _mm512_mul_ps(tt, s));
                    if (fmt == Q4_1) a = _mm512_add_ps(a, _mm512_mul_ps(mm, _mm512_set1_ps(sxa[r])));
                    acc[j][r] = a;
                }
            }
        }
        if (b < nb) {
            _tile_stored(4, sc->cb[p][0], 64);
            if (nB > 1) _tile_stored(5, sc->cb[p][1], 64);
        }
    }
    for (int j = 0; j < nB; j++) { /* y = acc + bias, element-wise, as on the other paths (0 without a bias) */
        const int gj = g + j, nn = N - gj * GN < GN ? N - gj * GN : GN;
        const __mmask16 k = (__mmask16)((1u << nn) - 1u);
        const __m512 bg = bias ? _mm512_maskz_loadu_ps(k, bias + gj * GN) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * N + gj * GN, k, _mm512_add_ps(acc[j][r], bg));
    }
}
#undef AMX_STAGE
static void amx_small_groups(int fmt, const xq_t *x, int R, int nb, int g0, int g1, size_t grp_bytes,
                             const uint8_t *wp, amx_scratch_t *sc, const float *bias, float *y, int N) {
    const int pair = R <= 8; /* two groups' accumulators fit the 32 vector registers */
    for (int g = g0; g < g1; g += pair ? 2 : 1) {
        const int nB = pair && g + 1 < g1 ? 2 : 1;
        const uint8_t *const wg[2] = {wp + (size_t)g * grp_bytes, wp + (size_t)(g + nB - 1) * grp_bytes};
        switch ((fmt * 17 + R) * 2 + nB - 1) {
#define S1(F, RR, NB) case (F * 17 + RR) * 2 + NB - 1: amx_small(F, x, RR, NB, nb, wg, sc, bias, y, N, g); break;
#define S2(F, RR) S1(F, RR, 1) S1(F, RR, 2)
#define SF(F) S2(F, 1) S2(F, 2) S2(F, 3) S2(F, 4) S2(F, 5) S2(F, 6) S2(F, 7) S2(F, 8) \
              S1(F, 9, 1) S1(F, 10, 1) S1(F, 11, 1) S1(F, 12, 1) S1(F, 13, 1) S1(F, 14, 1) S1(F, 15, 1) S1(F, 16, 1)
            SF(Q4_0) SF(Q4_1) SF(Q8_0)
#undef SF
#undef S2
#undef S1
            default: break;
        }
    }
}
#endif

/* When the AMX build uses its tiles: a step of at least amx_min_rows rows on a weight of at least AMX_MIN_WEIGHTS
 * entries (fewer of either: AVX512-VNNI). Tests and benchmarks set amx_min_rows to 1, which forces the tiles at
 * every row count and shape; the rule changes no bit, only which units work.
 * Why 16 rows and 2 Mi weights (2-core Xeon, 2 threads, benchmarks/int8_kernel_bytes.py, ms, tiles / VNNI): the
 * tiles' cost per block (unpacking nibbles into a B tile, storing each C tile for the combine) is repaid once the
 * VNNI path's dot products are the bound, which on weights past the caches starts at 4 rows (16384 x 8192 Q4_1:
 * 4 rows 2.54 / 2.72, 8 rows 2.91 / 4.05, 16 rows 5.18 / 7.46) but on weights the caches hold only at 16 rows
 * (2048 x 2048: 8 rows 0.125 / 0.116, 16 rows 0.195 / 0.226; the 49152 x 576 Q8_0 head: 8 rows 0.72 / 0.74,
 * 16 rows 0.90 / 1.44); on the 135M model's 576-wide layers (under 2 Mi weights) the per-call setup is not
 * repaid even at 16 rows (1536 x 576: 0.051 / 0.046; 3072 x 576: 0.087 / 0.090). */
#ifndef I8_AMX_MIN_ROWS
#define I8_AMX_MIN_ROWS 16
#endif
#define AMX_MIN_WEIGHTS ((size_t)1 << 21)
static int amx_min_rows = I8_AMX_MIN_ROWS;
int i8_set_amx_min_rows(int rows) {
    const int old = amx_min_rows;
    if (rows >= 1) amx_min_rows = rows;
    return old;
}

/* ---------------------------------------------------------------------------------------------- */
#define RT 64 /* x rows per pass over a group (their int8 rows stay in L1/L2 while the group's blocks pass) */

static int run(int fmt, const float *x, ptrdiff_t ldx, const xq_t *xq, const uint8_t *wp, const float *bias,
               float *y, int M, int K, int N, int nthreads) {
    const int nb = K / QK, rec = record_bytes(fmt), G = (N + GN - 1) / GN;
    const size_t grp_bytes = (size_t)nb * rec;
    int per = (G + nthreads - 1) / nthreads, tasks = per ? (G + per - 1) / per : 0;
    int rc = 0;
#if I8_PATH == 4
    const int use_amx = xq->qa != NULL; /* i8_linear decided, and tiled x for it */
#endif
    /* One parallel region: the threads round x's rows, then (after the loop's barrier) take the groups. */
    _Pragma("omp parallel num_threads(nthreads) reduction(|: rc)")
    {
    _Pragma("omp for schedule(static)")
    for (int m = 0; m < M; m++) quantize_row(x, ldx, m, K, xq);
    _Pragma("omp for schedule(static, 1)")
    for (int t = 0; t < tasks; t++) {
        const int g_end = (t + 1) * per < G ? (t + 1) * per : G;
#if I8_PATH == 4
        if (use_amx) { /* the groups two at a time, every row of x against each pair */
            amx_scratch_t *sc = aligned_alloc(64, sizeof(amx_scratch_t));
            float (*out2)[32][GN] = aligned_alloc(64, sizeof(float) * 2 * 32 * GN);
            if (!sc || !out2) { rc |= 1; free(sc); free(out2); continue; }
            if (M <= 16) {
                amx_config_rows(M);
                amx_small_groups(fmt, xq, M, nb, t * per, g_end, grp_bytes, wp, sc, bias, y, N);
                _tile_release();
                free(sc);
                free(out2);
                continue;
            }
            amx_config();
            for (int g = t * per; g < g_end; g += 2) {
                const int nB = g + 1 < g_end ? 2 : 1;
                const uint8_t *const wg2[2] = {wp + (size_t)g * grp_bytes, wp + (size_t)(g + nB - 1) * grp_bytes};
                amx_groups(fmt, xq, M, nb, wg2, nB, sc, out2, bias, y, N, g);
            }
            _tile_release();
            free(sc);
            free(out2);
            continue;
        }
#endif
        float (*out)[GN] = malloc(sizeof(float) * GN * RT);
        if (!out) { rc |= 1; continue; }
        for (int g = t * per; g < g_end; g++) {
            const uint8_t *wg = wp + (size_t)g * grp_bytes;
            for (int m0 = 0; m0 < M; m0 += RT) {
                const int R = M - m0 < RT ? M - m0 : RT;
#if I8_PATH == 0
                group_scalar(fmt, xq, m0, R, K, wg, out);
#else
                group_simd(fmt, xq, m0, R, K, wg, out);
#endif
                const int nn = N - g * GN < GN ? N - g * GN : GN;
                float bg[GN] = {0};
                if (bias) memcpy(bg, bias + g * GN, sizeof(float) * nn);
                for (int r = 0; r < R; r++) {
                    float *yr = y + (size_t)(m0 + r) * N + g * GN;
                    if (nn == GN) /* element-wise, so vectorised or not it is the same bits */
                        for (int n = 0; n < GN; n++) yr[n] = out[r][n] + bg[n];
                    else
                        for (int n = 0; n < nn; n++) yr[n] = out[r][n] + bg[n];
                }
            }
        }
        free(out);
    }
    }
    return rc ? -1 : 0;
}

/* x: (M, K) fp32, row stride ldx; wp: packed (i8_pack) weight of N rows; bias: (N) fp32 or NULL;
 * y: (M, N) fp32. Returns 0, or -1 (K not a multiple of 32, bad format, out of memory). */
int i8_linear(int fmt, const float *x, ptrdiff_t ldx, const uint8_t *wp, const float *bias, float *y,
              int M, int K, int N, int nthreads) {
    if (K % QK || fmt < Q4_0 || fmt > Q8_0 || M < 0 || N < 0) return -1;
    if (M == 0 || N == 0) return 0;
    const int nb = K / QK;
    xq_t xq = {malloc((size_t)M * K + 64), NULL, malloc(sizeof(float) * (size_t)M * nb),
               malloc(sizeof(float) * (size_t)M * nb), malloc(sizeof(int32_t) * (size_t)M * nb), NULL, NULL, NULL};
#if I8_PATH >= 3
    if (fmt == Q8_0) xq.qu = malloc((size_t)M * K + 64);
#endif
#if I8_PATH == 4
    if (M >= amx_min_rows && (amx_min_rows == 1 || (size_t)N * K >= AMX_MIN_WEIGHTS) && i8_amx_init() == 0) {
        const size_t tiles = (size_t)(M + 15) / 16 * nb;
        xq.qa = calloc(tiles * 512 + 64, 1); /* zero rows pad the last row tile */
        xq.dxa = calloc(tiles * 16, sizeof(float));
        xq.sxa = calloc(tiles * 16, sizeof(float));
        if (!xq.qa || !xq.dxa || !xq.sxa) { free(xq.qa); free(xq.dxa); free(xq.sxa); xq.qa = NULL; xq.dxa = xq.sxa = NULL; }
    }
#endif
    int rc = -1;
    if (xq.q && xq.dx && xq.sx && xq.sq && (fmt != Q8_0 || I8_PATH < 3 || xq.qu)) {
        rc = run(fmt, x, ldx, &xq, wp, bias, y, M, K, N, nthreads < 1 ? 1 : nthreads);
    }
    free(xq.q); free(xq.qu); free(xq.dx); free(xq.sx); free(xq.sq); free(xq.qa); free(xq.dxa); free(xq.sxa);
    return rc;
}
