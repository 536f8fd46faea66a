/* y = x @ w.T (+ bias) for fp32 with few rows of x: the decode-time matmul.
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
 * Threads: OpenMP over blocks of output columns (weight rows), each thread streaming a contiguous
 * part of w.
 */
#include <immintrin.h>
#include <stddef.h>

#define ROWS_PER_TILE 4
#define COLS_PER_TASK 64

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

/* Dot products of one weight row with R (1..4) rows of x. Each row's arithmetic is identical for
 * every R: two 8-lane accumulators over 16-wide steps, one 8-wide step, then a scalar tail. */
static inline void dot_rows(const float *x, ptrdiff_t ldx, const float *wr, int K, int R, float *out) {
    __m256 a0[ROWS_PER_TILE], a1[ROWS_PER_TILE];
    for (int r = 0; r < ROWS_PER_TILE; r++) { a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps(); }
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = _mm256_loadu_ps(wr + k), w1 = _mm256_loadu_ps(wr + k + 8);
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k + 8), w1, a1[r]);
        }
    }
    if (k + 8 <= K) {
        __m256 w0 = _mm256_loadu_ps(wr + k);
        for (int r = 0; r < R; r++) a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), w0, a0[r]);
        k += 8;
    }
    for (int r = 0; r < R; r++) {
        float s = hsum8(_mm256_add_ps(a0[r], a1[r]));
        for (int kk = k; kk < K; kk++) s += x[r * ldx + kk] * wr[kk];
        out[r] = s;
    }
}

/* x: (M, K) with row stride ldx; w: (N, K) contiguous; bias: (N) or NULL; y: (M, N) contiguous. */
void stream_linear_f32(const float *x, ptrdiff_t ldx, const float *w, const float *bias, float *y,
                       int M, int K, int N, int nthreads) {
    int tasks = (N + COLS_PER_TASK - 1) / COLS_PER_TASK;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < tasks; t++) {
        int n_end = (t + 1) * COLS_PER_TASK < N ? (t + 1) * COLS_PER_TASK : N;
        for (int n = t * COLS_PER_TASK; n < n_end; n++) {
            const float *wr = w + (ptrdiff_t)n * K;
            float b = bias ? bias[n] : 0.0f;
            for (int m0 = 0; m0 < M; m0 += ROWS_PER_TILE) {
                int R = M - m0 < ROWS_PER_TILE ? M - m0 : ROWS_PER_TILE;
                float out[ROWS_PER_TILE];
                const float *xt = x + (ptrdiff_t)m0 * ldx;
                /* constant R per call, so each case keeps its accumulators in registers */
                switch (R) {
                    case 4: dot_rows(xt, ldx, wr, K, 4, out); break;
                    case 3: dot_rows(xt, ldx, wr, K, 3, out); break;
                    case 2: dot_rows(xt, ldx, wr, K, 2, out); break;
                    default: dot_rows(xt, ldx, wr, K, 1, out); break;
                }
                for (int r = 0; r < R; r++) y[(ptrdiff_t)(m0 + r) * N + n] = out[r] + b;
            }
        }
    }
}
