/* Causal attention over keys named by slot indices, fp32, batch-invariant by construction.
 *
 * One call serves a whole ragged batch (the serving engine's flattened step: prefill chunks and
 * decodes together) or a dense cache (the single-request decoder): sequence i brings n_i query
 * tokens at positions c_i .. c_i + n_i - 1, and query j sees its keys 0 .. c_i + j, read through
 * slots[i][p] from a K/V store with any slot and head strides (the paged pool, or a dense cache).
 *
 * Why: the engine otherwise runs one SDPA per sequence per layer from Python (B small kernels and a
 * gather each, most of a saturated decode step's overhead), and SDPA's arithmetic depends on the
 * shape it is given. Here each (query, head) output is a fixed sequence of operations that depends
 * only on that query's own q and keys:
 *
 *     s_p = dot(q, k_p) * scale       (8 partial FMA chains over d, summed in a fixed tree)
 *     m = max_p s_p;  e_p = exp(s_p - m)  (the polynomial below, not libm, so it vectorises)
 *     l = sum_p e_p in order p;  out = (sum_p e_p * v_p in order p) / l
 *
 * so a token's attention output has the same bits in a batch of 1 or 64, chunked or not, with or
 * without a cached prefix, on any code path the compiler picks (fmaf rounds once, vector or not).
 *
 * Work items are (token, KV head): the query heads that share a KV head (GQA) read each key and value
 * once between them, which halved the kernel's time on SmolLM2 (9 query heads, 3 KV heads); each head
 * still has its own chains, so the arithmetic per output is unchanged.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* exp(x) for x <= 0 (softmax arguments), to ~2 ulp: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6
 * polynomial (Horner with fmaf), 2^n through the exponent bits. Branch-free, so loops over it vectorise. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x; /* e^-87 is below every softmax weight that matters; keeps 2^n normal */
    float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, x); /* ln2 split in two for an exact reduction */
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.3981999507e-3f;
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* dot(a, b) over D: eight partial sums (lane l takes d = l mod 8) by FMA, then the fixed tree
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). The AVX2 and scalar bodies compute exactly this. */
static inline float dot(const float *a, const float *b, int D) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    if (d < D) {
        float t[8];
        _mm256_storeu_ps(t, acc);
        for (int l = 0; d < D; d++, l++) t[l] = fmaf(a[d], b[d], t[l]);
        acc = _mm256_loadu_ps(t);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* s0+s4 .. s3+s7 */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                           /* (02)(13) */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55)));
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= D; d += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(a[d + l], b[d + l], acc[l]);
    for (int l = 0; d < D; d++, l++) acc[l] = fmaf(a[d], b[d], acc[l]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
#endif
}

/* q: token t, head h at q + t * q_tok + h * q_head (D contiguous floats).
 * k, v: slot s, kv head g at k + s * kv_slot + g * kv_head.
 * slots[slot_off[i] .. slot_off[i + 1]): sequence i's key slots in position order (c_i + n_i of them).
 * tok_off[i] .. tok_off[i + 1]: sequence i's query tokens; cached[i] = c_i.
 * out: (tokens, H, D) contiguous. */
void invariant_attention(const float *q, ptrdiff_t q_tok, ptrdiff_t q_head, const float *k, const float *v,
                         ptrdiff_t kv_slot, ptrdiff_t kv_head, const int64_t *slots, const int64_t *slot_off,
                         const int64_t *tok_off, const int64_t *cached, int B, int H, int Hkv, int D, float scale,
                         float *out, int threads) {
    int64_t tokens = tok_off[B];
    int group = H / Hkv;
    int64_t items = tokens * Hkv;
#pragma omp parallel num_threads(threads)
    {
        int64_t cap = 0;
        for (int i = 0; i < B; i++) {
            int64_t len = slot_off[i + 1] - slot_off[i];
            cap = len > cap ? len : cap;
        }
        if (cap < 1) cap = 1;
        /* Scores of the group's heads, head j at s + j * cap (heap: a long context times a large group
         * would not fit a thread's stack). */
        float *s = malloc(sizeof(float) * (size_t)cap * (size_t)group);
        float *acc = malloc(sizeof(float) * (size_t)D * (size_t)group);
        int seq = 0;
#pragma omp for schedule(dynamic, 4)
        for (int64_t item = 0; item < items; item++) {
            int64_t t = item / Hkv;
            int g = (int)(item % Hkv);
            while (tok_off[seq + 1] <= t) seq++; /* items come in increasing t per thread */
            while (tok_off[seq] > t) seq--;
            int64_t len = cached[seq] + (t - tok_off[seq]) + 1; /* keys 0 .. position */
            const int64_t *sl = slots + slot_off[seq];
            float m[group];
            for (int j = 0; j < group; j++) m[j] = -INFINITY;
            for (int64_t p = 0; p < len; p++) {
                const float *kp = k + sl[p] * kv_slot + g * kv_head;
                for (int j = 0; j < group; j++) {
                    float x = dot(q + t * q_tok + (g * group + j) * q_head, kp, D) * scale;
                    s[j * cap + p] = x;
                    m[j] = x > m[j] ? x : m[j];
                }
            }
            for (int j = 0; j < group; j++) {
                float *sj = s + j * cap, l = 0.0f;
                for (int64_t p = 0; p < len; p++) sj[p] = exp_neg(sj[p] - m[j]);
                for (int64_t p = 0; p < len; p++) l += sj[p];
                m[j] = 1.0f / l; /* reused: the normaliser */
            }
            for (int i = 0; i < D * group; i++) acc[i] = 0.0f;
            for (int64_t p = 0; p < len; p++) {
                const float *vv = v + sl[p] * kv_slot + g * kv_head;
                for (int j = 0; j < group; j++) {
                    float e = s[j * cap + p], *o = acc + j * D;
                    for (int d = 0; d < D; d++) o[d] = fmaf(e, vv[d], o[d]);
                }
            }
            for (int j = 0; j < group; j++) {
                float *o = out + (t * H + g * group + j) * D, *a = acc + j * D;
                for (int d = 0; d < D; d++) o[d] = a[d] * m[j];
            }
        }
        free(s);
        free(acc);
    }
}
