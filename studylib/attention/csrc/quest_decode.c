/* Quest's decode step on CPU, fused: score the pages, choose them, attend to what was chosen.
 *
 * Why this exists: in eager PyTorch a selecting step is ~15 small tensor ops per layer (bounds, sort,
 * index arithmetic, two gathers that copy the chosen keys and values, a masked SDPA); at 8k tokens
 * they cost more than the K/V bytes they save. Here one call per layer reads each page summary once,
 * picks the pages with a linear-time selection, and attends straight from the cache (no copies).
 *
 * Semantics are those of studylib/attention/quest.py (select_tokens + gather_attention), the tested
 * reference: a page's score is max over the G query heads of its KV head of
 *     sum_d max(q_d * min_d, q_d * max_d),
 * candidates are pages holding a key that is neither a sink (< S) nor recent (>= L - R), the n_sel
 * best are read (ties: the lower page, as a stable sort gives), keys counted once, softmax in fp32.
 * Layouts: q (B, H, D); k, v (B, Hkv, Tmax, D); kmin, kmax (B, Hkv, NPmax, D); out (B, H, D); fp32.
 * Threads: OpenMP over (batch, KV head) pairs.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

static inline float dot(const float *a, const float *b, int D) {
    int d = 0;
    float s = 0.0f;
    if (D >= 8) {
        __m256 acc = _mm256_setzero_ps();
        for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
        s = hsum8(acc);
    }
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* sum_d max(q*lo, q*hi) = q+ . hi + q- . lo */
static inline float bound(const float *q, const float *lo, const float *hi, int D) {
    int d = 0;
    float s = 0.0f;
    if (D >= 8) {
        __m256 acc = _mm256_setzero_ps();
        const __m256 zero = _mm256_setzero_ps();
        for (; d + 8 <= D; d += 8) {
            __m256 qq = _mm256_loadu_ps(q + d);
            acc = _mm256_fmadd_ps(_mm256_max_ps(qq, zero), _mm256_loadu_ps(hi + d), acc);
            acc = _mm256_fmadd_ps(_mm256_min_ps(qq, zero), _mm256_loadu_ps(lo + d), acc);
        }
        s = hsum8(acc);
    }
    for (; d < D; d++) s += q[d] > 0 ? q[d] * hi[d] : q[d] * lo[d];
    return s;
}

/* The k-th largest of a[0..n) (k >= 1), by quickselect on a scratch copy. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = a[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) { float t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

void quest_decode_f32(const float *q, const float *k, const float *v, const float *kmin, const float *kmax,
                      float *out, int B, int H, int Hkv, int D, int Tmax, int NPmax, int L, int P, int S, int R,
                      int n_sel, float scale, int threads) {
    const int G = H / Hkv;
    const int NP = (L + P - 1) / P;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int bh = 0; bh < B * Hkv; bh++) {
        const int b = bh / Hkv, hk = bh % Hkv;
        const float *qb = q + ((size_t)b * H + (size_t)hk * G) * D;
        const float *kb = k + (size_t)bh * Tmax * D, *vb = v + (size_t)bh * Tmax * D;
        const float *lo = kmin + (size_t)bh * NPmax * D, *hi = kmax + (size_t)bh * NPmax * D;
        float *score = malloc(sizeof(float) * (size_t)NP * 2);
        float *scratch = score + NP;
        int *tok = malloc(sizeof(int) * (size_t)(S + R + n_sel * P));
        /* 1. page scores (candidates only; others -inf) */
        int n_cand = 0;
        for (int p = 0; p < NP; p++) {
            int first = p * P, last = (first + P < L ? first + P : L) - 1;
            if (last < S || first >= L - R) { score[p] = -INFINITY; continue; }
            float best = -INFINITY;
            for (int g = 0; g < G; g++) {
                float s = bound(qb + (size_t)g * D, lo + (size_t)p * D, hi + (size_t)p * D, D);
                if (s > best) best = s;
            }
            score[p] = best;
            scratch[n_cand++] = best;
        }
        /* 2. the n_sel best pages, ties to the lower page; then the token list (each key once) */
        int take = n_sel < n_cand ? n_sel : n_cand, nt = 0;
        for (int t = 0; t < S; t++) tok[nt++] = t;
        if (take > 0) {
            float thr = kth_largest(scratch, n_cand, take);
            int above = 0;
            for (int p = 0; p < NP; p++) above += score[p] > thr;
            int ties = take - above;
            for (int p = 0; p < NP; p++) {
                int pick = score[p] > thr || (score[p] == thr && ties-- > 0);
                if (!pick) continue;
                for (int t = p * P; t < p * P + P; t++)
                    if (t >= S && t < L - R) tok[nt++] = t;
            }
        }
        for (int t = L - R; t < L; t++) tok[nt++] = t;
        /* 3. attention of the G heads over the chosen keys: scores, softmax, weighted values */
        float *sc = malloc(sizeof(float) * (size_t)nt * G);
        for (int i = 0; i < nt; i++) {
            const float *kr = kb + (size_t)tok[i] * D;
            for (int g = 0; g < G; g++) sc[(size_t)g * nt + i] = dot(qb + (size_t)g * D, kr, D) * scale;
        }
        for (int g = 0; g < G; g++) {
            float *s = sc + (size_t)g * nt, m = -INFINITY, sum = 0.0f;
            for (int i = 0; i < nt; i++) m = s[i] > m ? s[i] : m;
            for (int i = 0; i < nt; i++) { s[i] = expf(s[i] - m); sum += s[i]; }
            float *o = out + ((size_t)b * H + (size_t)hk * G + g) * D;
            memset(o, 0, sizeof(float) * D);
            for (int i = 0; i < nt; i++) {
                const float *vr = vb + (size_t)tok[i] * D;
                float w = s[i] / sum;
                for (int d = 0; d < D; d++) o[d] += w * vr[d];
            }
        }
        free(sc);
        free(tok);
        free(score);
    }
}
