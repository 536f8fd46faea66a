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

/* Paths: 0 scalar, 1 avx2, 2 avxvnni, 3 avx512vnni, 4 amx (AMX-INT8 for 16-row tiles, else 3). */
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
    }
}

/* Exported for tests: the rounding alone. */
void i8_quantize(const float *x, ptrdiff_t ldx, int M, int K, int8_t *q, float *dx, int32_t *sq, float *sx) {
    xq_t o = {q, NULL, dx, sx, sq};
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
/* AMX-INT8: per block, a 16 x 16 tile of exact int32 sums (16 x rows by the group's 16 weight rows)
 * from one tile multiply; the float steps are the same element-wise ones as above. */
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
static void amx_config(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = 16; cfg.colsb[i] = 64;         /* C: 16 x rows x 16 int32 */
        cfg.rows[2 + i] = 16; cfg.colsb[2 + i] = 32; /* A: 16 x rows x 32 int8 (one block) */
        cfg.rows[4 + i] = 8; cfg.colsb[4 + i] = 64;  /* B: 8 x (16 weight rows x 4 bytes) */
    }
    _tile_loadconfig(&cfg);
}
/* The float steps of one block for 16 rows, from that block's tile of int32 sums. */
static inline __attribute__((always_inline)) void amx_combine(int fmt, const xq_t *x, int r0, int nb, int b,
                                                              const uint8_t *rp, int32_t sums[16][16],
                                                              __m512 acc[16]) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
    __m512 mm = _mm512_setzero_ps();
    if (fmt == Q4_1) mm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
    for (int r = 0; r < 16; r++) {
        __m512i s = _mm512_load_si512(sums[r]);
        const size_t xi = (size_t)(r0 + r) * nb + b;
        if (fmt == Q4_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * x->sq[xi]));
        const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(x->dx[xi]));
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(t, _mm512_cvtepi32_ps(s)));
        if (fmt == Q4_1) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(mm, _mm512_set1_ps(x->sx[xi])));
    }
}
/* 16 x rows (a full tile) against one group; wu: the group's quants unpacked to bytes, 512 per block.
 * Two blocks in flight (tiles 0/2/4 and 1/3/5), so one block's float steps overlap the next multiply. */
static void tile_amx(int fmt, const xq_t *x, int r0, int K, const uint8_t *wg, const uint8_t *wu,
                     float out[][GN]) {
    const int nb = K / QK, rec = record_bytes(fmt);
    __m512 acc[16];
    int32_t s0[16][16] __attribute__((aligned(64))), s1[16][16] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    const int8_t *xa = x->q + (size_t)r0 * K;
#define BTILE(b) (fmt == Q8_0 ? wg + (size_t)(b) * rec + qoff(fmt) : wu + (size_t)(b) * 512)
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, xa + b * QK, K);
        _tile_loadd(4, BTILE(b), 64);
        _tile_loadd(3, xa + (b + 1) * QK, K);
        _tile_loadd(5, BTILE(b + 1), 64);
        if (fmt == Q8_0) { _tile_dpbssd(0, 2, 4); _tile_dpbssd(1, 3, 5); }
        else { _tile_dpbsud(0, 2, 4); _tile_dpbsud(1, 3, 5); }
        _tile_stored(0, s0, 64);
        _tile_stored(1, s1, 64);
        amx_combine(fmt, x, r0, nb, b, wg + (size_t)b * rec, s0, acc);
        amx_combine(fmt, x, r0, nb, b + 1, wg + (size_t)(b + 1) * rec, s1, acc);
    }
    if (b < nb) {
        _tile_zero(0);
        _tile_loadd(2, xa + b * QK, K);
        _tile_loadd(4, BTILE(b), 64);
        if (fmt == Q8_0) _tile_dpbssd(0, 2, 4);
        else _tile_dpbsud(0, 2, 4);
        _tile_stored(0, s0, 64);
        amx_combine(fmt, x, r0, nb, b, wg + (size_t)b * rec, s0, acc);
    }
#undef BTILE
    for (int r = 0; r < 16; r++) _mm512_storeu_ps(out[r], acc[r]);
}
static void unpack_group(const uint8_t *wg, int nb, int rec, int fmt, uint8_t *wu) {
    const __m512i lo = _mm512_set1_epi8(15);
    for (int b = 0; b < nb; b++) {
        const uint8_t *qd = wg + (size_t)b * rec + qoff(fmt);
        for (int c = 0; c < 4; c++) {
            __m512i p = _mm512_loadu_si512(qd + 64 * c);
            _mm512_storeu_si512(wu + (size_t)b * 512 + 64 * c, _mm512_and_si512(p, lo));
            _mm512_storeu_si512(wu + (size_t)b * 512 + 64 * (c + 4), _mm512_and_si512(_mm512_srli_epi16(p, 4), lo));
        }
    }
}
#endif

/* ---------------------------------------------------------------------------------------------- */
#define RT 64 /* x rows per pass over a group (their int8 rows stay in L1/L2 while the group's blocks pass) */

static int run(int fmt, const float *x, ptrdiff_t ldx, const xq_t *xq, const uint8_t *wp, const float *bias,
               float *y, int M, int K, int N, int nthreads) {
    const int nb = K / QK, rec = record_bytes(fmt), G = (N + GN - 1) / GN;
    const size_t grp_bytes = (size_t)nb * rec;
    int per = (G + nthreads - 1) / nthreads, tasks = per ? (G + per - 1) / per : 0;
    int rc = 0;
#if I8_PATH == 4
    const int use_amx = M >= 16 && i8_amx_init() == 0;
#endif
    /* One parallel region: the threads round x's rows, then (after the loop's barrier) take the groups. */
    _Pragma("omp parallel num_threads(nthreads) reduction(|: rc)")
    {
    _Pragma("omp for schedule(static)")
    for (int m = 0; m < M; m++) quantize_row(x, ldx, m, K, xq);
    _Pragma("omp for schedule(static, 1)")
    for (int t = 0; t < tasks; t++) {
        float (*out)[GN] = malloc(sizeof(float) * GN * RT);
#if I8_PATH == 4
        uint8_t *wu = NULL;
        if (use_amx && fmt != Q8_0) wu = aligned_alloc(64, (size_t)nb * 512 + 64);
        if (use_amx) amx_config();
        if (!out || (use_amx && fmt != Q8_0 && !wu)) { rc |= 1; free(out); free(wu); continue; }
#else
        if (!out) { rc |= 1; continue; }
#endif
        const int g_end = (t + 1) * per < G ? (t + 1) * per : G;
        for (int g = t * per; g < g_end; g++) {
            const uint8_t *wg = wp + (size_t)g * grp_bytes;
#if I8_PATH == 4
            if (wu) unpack_group(wg, nb, rec, fmt, wu);
#endif
            for (int m0 = 0; m0 < M; m0 += RT) {
                const int R = M - m0 < RT ? M - m0 : RT;
                int done = 0;
#if I8_PATH == 4
                if (use_amx)
                    for (; done + 16 <= R; done += 16) tile_amx(fmt, xq, m0 + done, K, wg, wu, out + done);
#endif
                if (done < R) {
#if I8_PATH == 0
                    group_scalar(fmt, xq, m0 + done, R - done, K, wg, out + done);
#else
                    group_simd(fmt, xq, m0 + done, R - done, K, wg, out + done);
#endif
                }
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
#if I8_PATH == 4
        if (use_amx) _tile_release();
        free(wu);
#endif
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
               malloc(sizeof(float) * (size_t)M * nb), malloc(sizeof(int32_t) * (size_t)M * nb)};
#if I8_PATH >= 3
    if (fmt == Q8_0) xq.qu = malloc((size_t)M * K + 64);
#endif
    int rc = -1;
    if (xq.q && xq.dx && xq.sx && xq.sq && (fmt != Q8_0 || I8_PATH < 3 || xq.qu)) {
        rc = run(fmt, x, ldx, &xq, wp, bias, y, M, K, N, nthreads < 1 ? 1 : nthreads);
    }
    free(xq.q); free(xq.qu); free(xq.dx); free(xq.sx); free(xq.sq);
    return rc;
}
