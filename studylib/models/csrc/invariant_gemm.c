/* y = x @ w.T (+ bias), fp32, batch-invariant by construction: the serving engine's linear layer.
 *
 * Why this exists: MKL's GEMM picks its blocking (and a GEMV path for one row) from the shape, so a
 * row of x gets different low bits when it is computed with 1, 5 or 64 other rows. Greedy decoding
 * then flips at near-ties and a batched server stops matching single-request decoding. Here every
 * output is ONE chain of fused multiply-adds over k = 0..K-1 in order, starting from zero, plus the
 * bias once at the end:
 *
 *     acc = 0; for k in 0..K-1: acc = fma(x[m, k], w[n, k], acc);  y[m, n] = acc (+ bias[n])
 *
 * whatever M is, wherever row m sits in the batch, and whichever code path (AVX-512, AVX2 or scalar)
 * computes it: FMA rounds once, so the vector lanes and the scalar fmaf() agree bit for bit.
 *
 * Speed: the K-chain is vectorised across output columns, not across k. The weight is packed once
 * (wp, see invariant_pack) as panels of NR = 32 columns, each panel K x 32 contiguous and zero-padded
 * past N. A tile of R rows x 32 columns keeps R * 32 accumulators in registers and streams its panel
 * (which stays in L2 while all row tiles pass over it); OpenMP splits the panels between threads.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define NR 32

#if defined(__AVX512F__)
/* 8 rows x 32 columns: 16 zmm accumulators. */
#define RMAX 8
static void tile(const float *x, ptrdiff_t ldx, const float *wp, int K, int R, float *acc /* [RMAX][NR] */) {
    __m512 a[RMAX][2];
    for (int r = 0; r < RMAX; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    if (R == RMAX) {
        for (int k = 0; k < K; k++) {
            __m512 w0 = _mm512_loadu_ps(wp + (size_t)k * NR), w1 = _mm512_loadu_ps(wp + (size_t)k * NR + 16);
#pragma GCC unroll 8
            for (int r = 0; r < RMAX; r++) {
                __m512 b = _mm512_set1_ps(x[r * ldx + k]);
                a[r][0] = _mm512_fmadd_ps(b, w0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(b, w1, a[r][1]);
            }
        }
    } else {
        for (int k = 0; k < K; k++) {
            __m512 w0 = _mm512_loadu_ps(wp + (size_t)k * NR), w1 = _mm512_loadu_ps(wp + (size_t)k * NR + 16);
            for (int r = 0; r < R; r++) {
                __m512 b = _mm512_set1_ps(x[r * ldx + k]);
                a[r][0] = _mm512_fmadd_ps(b, w0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(b, w1, a[r][1]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(acc + r * NR, a[r][0]);
        _mm512_storeu_ps(acc + r * NR + 16, a[r][1]);
    }
}
#define ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
/* 3 rows x 32 columns: 12 ymm accumulators. */
#define RMAX 3
static void tile(const float *x, ptrdiff_t ldx, const float *wp, int K, int R, float *acc) {
    __m256 a[RMAX][4];
    for (int r = 0; r < RMAX; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *w = wp + (size_t)k * NR;
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8), w2 = _mm256_loadu_ps(w + 16),
               w3 = _mm256_loadu_ps(w + 24);
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_set1_ps(x[r * ldx + k]);
            a[r][0] = _mm256_fmadd_ps(b, w0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(b, w1, a[r][1]);
            a[r][2] = _mm256_fmadd_ps(b, w2, a[r][2]);
            a[r][3] = _mm256_fmadd_ps(b, w3, a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(acc + r * NR + 8 * j, a[r][j]);
}
#define ISA_NAME "avx2"
#else
/* Portable reference path: the same FMA chain, one output at a time. */
#define RMAX 4
static void tile(const float *x, ptrdiff_t ldx, const float *wp, int K, int R, float *acc) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(x[r * ldx + k], wp[(size_t)k * NR + j], s);
            acc[r * NR + j] = s;
        }
}
#define ISA_NAME "scalar"
#endif

const char *invariant_gemm_isa(void) { return ISA_NAME; }

/* Pack w (N x K, row-major) into ceil(N / 32) panels of K x 32, zero-padded: wp[p][k][j] = w[32p + j][k]. */
void invariant_pack(const float *w, int N, int K, float *wp) {
    int panels = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < panels; p++) {
        float *dst = wp + (size_t)p * K * NR;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < NR; j++) {
                int n = p * NR + j;
                dst[(size_t)k * NR + j] = n < N ? w[(size_t)n * K + k] : 0.0f;
            }
    }
}

/* y (M x N, row stride N) = x (M x K, row stride ldx) @ w.T (+ bias), w given packed as wp. */
void invariant_gemm(const float *x, ptrdiff_t ldx, const float *wp, const float *bias, float *y, int M, int K,
                    int N, int threads) {
    int panels = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < panels; p++) {
        float acc[RMAX * NR];
        const float *w = wp + (size_t)p * K * NR;
        int n0 = p * NR, nc = N - n0 < NR ? N - n0 : NR;
        for (int m = 0; m < M; m += RMAX) {
            int R = M - m < RMAX ? M - m : RMAX;
            tile(x + (size_t)m * ldx, ldx, w, K, R, acc);
            for (int r = 0; r < R; r++) {
                float *dst = y + (size_t)(m + r) * N + n0;
                if (bias)
                    for (int j = 0; j < nc; j++) dst[j] = acc[r * NR + j] + bias[n0 + j];
                else
                    memcpy(dst, acc + r * NR, sizeof(float) * (size_t)nc);
            }
        }
    }
}
