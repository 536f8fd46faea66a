/* y = x @ w.T (+ bias) with few rows of x, fp32 or bf16 weights: the decode-time matmul.
 *
 * Why this exists: at batch 1 a decoder step reads every weight once and does two FLOPs per weight,
 * so it is bound by memory bandwidth. MKL's GEMV path streams the weights, but as soon as x has two
 * or more rows MKL switches to a GEMM that packs (copies) the weight matrix first, so a 5-token
 * verify step costs ~2x a 1-token step although it reads the same bytes. Here each weight row is
 * read from memory once and dotted with every row of x while it sits in L1.
 *
 * Row invariance, by construction: every output y[m, n] is the same sequence of fp32 operations
 * whatever M is and wherever row m sits in x (one code path per row; tiling only decides which rows
 * share a weight load). So a token computed in a batch of 5 is bit-identical to the same token
 * computed alone, which keeps speculative verification and batched serving exactly lossless.
 *
 * bf16 weights are widened to fp32 and accumulated in fp32 (x and y are fp32): half the bytes read,
 * the same arithmetic as an fp32 weight holding the bf16 value.
 *
 * Threads: OpenMP, one contiguous and equal share of the output columns (weight rows) per thread,
 * so each thread streams its own part of w and neither waits on the other at the barrier.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ROWS_PER_TILE 4

/* Horizontal sum in a fixed order. */
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                 /* 4 lanes */
    __m128 sh = _mm_movehl_ps(s, s);
    s = _mm_add_ps(s, sh);                         /* 2 lanes */
    sh = _mm_shuffle_ps(s, s, 0x55);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

/* Weight loads: 8 fp32, or 8 bf16 widened exactly to fp32 (bf16 is the top half of an fp32). */
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static inline float scalar_f32(const float *p) { return *p; }
static inline float scalar_bf16(const uint16_t *p) {
    uint32_t bits = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Dot products of NW (1..8) weight rows with R (1..2) rows of x: NW * R <= 8 independent accumulators,
 * so a single decode row still keeps eight FMA chains in flight (one chain would wait on FMA latency),
 * and each x load feeds NW FMAs. Every output's arithmetic is the same for every NW and R: one 8-lane
 * accumulator over 8-wide steps, a fixed-order horizontal sum, then a scalar tail. */
#define MAX_NW 8
#define DEFINE_STREAM_LINEAR(NAME, WT, LOAD8, SCALAR)                                                   \
static inline __attribute__((always_inline)) void NAME##_dot(                                           \
        const float *x, ptrdiff_t ldx, const WT *w, int K, int NW, int R, float *out /* [NW][4] */) {   \
    __m256 acc[MAX_NW][2];                                                                              \
    for (int j = 0; j < NW; j++)                                                                        \
        for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();                                    \
    int k = 0;                                                                                          \
    for (; k + 8 <= K; k += 8) {                                                                        \
        __m256 xv[2];                                                                                   \
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k);                          \
        for (int j = 0; j < NW; j++) {                                                                  \
            __m256 wv = LOAD8(w + (ptrdiff_t)j * K + k);                                                \
            for (int r = 0; r < R; r++) acc[j][r] = _mm256_fmadd_ps(xv[r], wv, acc[j][r]);              \
        }                                                                                               \
    }                                                                                                   \
    for (int j = 0; j < NW; j++) {                                                                      \
        const WT *wr = w + (ptrdiff_t)j * K;                                                            \
        for (int r = 0; r < R; r++) {                                                                   \
            float s = hsum8(acc[j][r]);                                                                 \
            for (int kk = k; kk < K; kk++) s += x[r * ldx + kk] * SCALAR(wr + kk);                      \
            out[j * ROWS_PER_TILE + r] = s;                                                             \
        }                                                                                               \
    }                                                                                                   \
}                                                                                                       \
                                                                                                        \
/* The same arithmetic for x with 3 or more rows: tiles of up to 4 rows against 1-2 weight rows, in a  \
 * [2][4] accumulator block (measured 5-10% faster there than the general form above). */              \
static inline __attribute__((always_inline)) void NAME##_dot_narrow(                                    \
        const float *x, ptrdiff_t ldx, const WT *w, int K, int NW, int R, float *out) {                 \
    __m256 acc[2][ROWS_PER_TILE];                                                                       \
    for (int j = 0; j < 2; j++)                                                                         \
        for (int r = 0; r < ROWS_PER_TILE; r++) acc[j][r] = _mm256_setzero_ps();                        \
    const WT *w1 = w + (NW == 2 ? K : 0);                                                               \
    int k = 0;                                                                                          \
    for (; k + 8 <= K; k += 8) {                                                                        \
        __m256 wa = LOAD8(w + k);                                                                       \
        __m256 wb = NW == 2 ? LOAD8(w1 + k) : wa;                                                       \
        for (int r = 0; r < R; r++) {                                                                   \
            __m256 xv = _mm256_loadu_ps(x + r * ldx + k);                                               \
            acc[0][r] = _mm256_fmadd_ps(xv, wa, acc[0][r]);                                             \
            if (NW == 2) acc[1][r] = _mm256_fmadd_ps(xv, wb, acc[1][r]);                                \
        }                                                                                               \
    }                                                                                                   \
    for (int j = 0; j < NW; j++) {                                                                      \
        const WT *wr = j ? w1 : w;                                                                      \
        for (int r = 0; r < R; r++) {                                                                   \
            float s = hsum8(acc[j][r]);                                                                 \
            for (int kk = k; kk < K; kk++) s += x[r * ldx + kk] * SCALAR(wr + kk);                      \
            out[j * ROWS_PER_TILE + r] = s;                                                             \
        }                                                                                               \
    }                                                                                                   \
}                                                                                                       \
                                                                                                        \
/* x with 1-2 rows: one case per (NW, R), with constant trip counts so the accumulators stay in      \
 * registers. */                                                                                        \
static void NAME##_tile(const float *x, ptrdiff_t ldx, const WT *w, int K, int NW, int R, float *out) { \
    switch (NW * 8 + R) {                                                                               \
        case 8 * 8 + 1: NAME##_dot(x, ldx, w, K, 8, 1, out); break;                                     \
        case 7 * 8 + 1: NAME##_dot(x, ldx, w, K, 7, 1, out); break;                                     \
        case 6 * 8 + 1: NAME##_dot(x, ldx, w, K, 6, 1, out); break;                                     \
        case 5 * 8 + 1: NAME##_dot(x, ldx, w, K, 5, 1, out); break;                                     \
        case 4 * 8 + 1: NAME##_dot(x, ldx, w, K, 4, 1, out); break;                                     \
        case 3 * 8 + 1: NAME##_dot(x, ldx, w, K, 3, 1, out); break;                                     \
        case 2 * 8 + 1: NAME##_dot(x, ldx, w, K, 2, 1, out); break;                                     \
        case 4 * 8 + 2: NAME##_dot(x, ldx, w, K, 4, 2, out); break;                                     \
        case 3 * 8 + 2: NAME##_dot(x, ldx, w, K, 3, 2, out); break;                                     \
        case 2 * 8 + 2: NAME##_dot(x, ldx, w, K, 2, 2, out); break;                                     \
        case 1 * 8 + 2: NAME##_dot(x, ldx, w, K, 1, 2, out); break;                                     \
        default: NAME##_dot(x, ldx, w, K, 1, 1, out); break;                                            \
    }                                                                                                   \
}                                                                                                       \
                                                                                                        \
static void NAME##_narrow(const float *x, ptrdiff_t ldx, const WT *w, int K, int NW, int R, float *out) { \
    switch (NW * 8 + R) {                                                                               \
        case 2 * 8 + 4: NAME##_dot_narrow(x, ldx, w, K, 2, 4, out); break;                              \
        case 2 * 8 + 3: NAME##_dot_narrow(x, ldx, w, K, 2, 3, out); break;                              \
        case 2 * 8 + 2: NAME##_dot_narrow(x, ldx, w, K, 2, 2, out); break;                              \
        case 2 * 8 + 1: NAME##_dot_narrow(x, ldx, w, K, 2, 1, out); break;                              \
        case 1 * 8 + 4: NAME##_dot_narrow(x, ldx, w, K, 1, 4, out); break;                              \
        case 1 * 8 + 3: NAME##_dot_narrow(x, ldx, w, K, 1, 3, out); break;                              \
        case 1 * 8 + 2: NAME##_dot_narrow(x, ldx, w, K, 1, 2, out); break;                              \
        default: NAME##_dot_narrow(x, ldx, w, K, 1, 1, out); break;                                     \
    }                                                                                                   \
}                                                                                                       \
                                                                                                        \
/* x: (M, K) fp32 with row stride ldx; w: (N, K) contiguous; bias: (N) fp32 or NULL; y: (M, N) fp32. */ \
void NAME(const float *x, ptrdiff_t ldx, const WT *w, const float *bias, float *y,                      \
          int M, int K, int N, int nthreads) {                                                          \
    /* One contiguous, equal share of the weight rows per thread (a multiple of 8 rows). */             \
    int per = (N + nthreads - 1) / nthreads;                                                            \
    per = (per + 7) / 8 * 8;                                                                            \
    int tasks = (N + per - 1) / per;                                                                    \
    _Pragma("omp parallel for num_threads(nthreads) schedule(static, 1)")                               \
    for (int t = 0; t < tasks; t++) {                                                                   \
        int n_end = (t + 1) * per < N ? (t + 1) * per : N;                                              \
        /* A block of weight rows stays in L1 while every tile of x rows passes over it: 8 rows when   \
         * x has 1-2 rows (8 or 4 rows per pass), 2 rows otherwise (measured faster from 3 rows on). */ \
        int block = M <= 2 ? MAX_NW : 2;                                                                \
        for (int nb = t * per; nb < n_end; nb += block) {                                               \
            int nb_end = nb + block < n_end ? nb + block : n_end;                                       \
            for (int m0 = 0; m0 < M; m0 += ROWS_PER_TILE) {                                             \
                int R = M - m0 < ROWS_PER_TILE ? M - m0 : ROWS_PER_TILE;                                \
                int want = block == 2 ? 2 : MAX_NW / R; /* wide path: R is 1 or 2 */                    \
                const float *xt = x + (ptrdiff_t)m0 * ldx;                                              \
                for (int n = nb; n < nb_end; n += want) {                                               \
                    int NW = nb_end - n < want ? nb_end - n : want;                                     \
                    float out[MAX_NW * ROWS_PER_TILE];                                                  \
                    if (block == 2)                                                                     \
                        NAME##_narrow(xt, ldx, w + (ptrdiff_t)n * K, K, NW, R, out);                    \
                    else                                                                                \
                        NAME##_tile(xt, ldx, w + (ptrdiff_t)n * K, K, NW, R, out);                      \
                    for (int j = 0; j < NW; j++) {                                                      \
                        float b = bias ? bias[n + j] : 0.0f;                                            \
                        for (int r = 0; r < R; r++)                                                     \
                            y[(ptrdiff_t)(m0 + r) * N + n + j] = out[j * ROWS_PER_TILE + r] + b;        \
                    }                                                                                   \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
}

DEFINE_STREAM_LINEAR(stream_linear_f32, float, load8_f32, scalar_f32)
DEFINE_STREAM_LINEAR(stream_linear_bf16, uint16_t, load8_bf16, scalar_bf16)
