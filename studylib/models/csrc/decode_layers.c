/* Every decoder layer of a few-row step in one call: the block-format engine's decode path.
 *
 * Why: with 4-bit weights the linears of a SmolLM2-135M decode step take ~12 ms on 2 cores, and the
 * ~50 small PyTorch ops per layer around them (norms, RoPE, KV writes, attention, SiLU, residuals)
 * took as long again in dispatch overhead. Here one call runs all layers for M = B * T rows.
 *
 * Per layer, for every row: h = rmsnorm(x) * w_in; q,k,v = h @ Wqkv (+ bias); RoPE on q and k with
 * the cos/sin rows the caller computed (the same tables as the PyTorch path); k, v written into the
 * cache slots [s, s + T); attention of each query head over slots [0, s + T) of its KV head, masked;
 * x += attn @ Wo; h = rmsnorm(x) * w_post; x += (silu(h @ Wg) * (h @ Wu)) @ Wd.
 *
 * Row invariance, by construction: every row's arithmetic is a fixed sequence that does not depend on
 * B, T or the row's place, and the cache slots a row reads were written by the same code. So a token
 * verified in a block of T (speculative, Jacobi, trees) has the bits it has when decoded alone.
 * With int8 or bf16 activations (weights coded ACT_BASE + fmt) the linears round each row's input on
 * its own, so the same holds.
 * Mask: NULL means causal (row t sees slots [0, s + t]); else uint8 (B, T, s + T), 1 = visible.
 */
#include <math.h>
#include <omp.h>

#include "quant_linear.c"

/* Weights with format code ACT_BASE + fmt are packed for int8 or bf16 activations (`--act`) and go to
 * that arithmetic's kernel (int8_linear.c's i8_linear, bf16_linear.c's bf_linear), a separate library
 * (one build per ISA path) whose entry point Python hands over with decode_layers_set_act before the
 * call. A model has one arithmetic, so one entry serves all its linears. */
#define ACT_BASE 10
typedef int (*act_linear_fn)(int, const float *, ptrdiff_t, const uint8_t *, const float *, float *, int, int,
                             int, int);
static act_linear_fn act_linear_ptr = NULL;
void decode_layers_set_act(void *fn) { act_linear_ptr = (act_linear_fn)fn; }

static int linear(int fmt, const float *x, ptrdiff_t ldx, const uint8_t *w, const float *bias, float *y, int M,
                  int K, int N, int nthreads) {
    if (fmt >= ACT_BASE)
        return act_linear_ptr ? act_linear_ptr(fmt - ACT_BASE, x, ldx, w, bias, y, M, K, N, nthreads) : -3;
    return quant_linear(fmt, x, ldx, w, bias, y, M, K, N, nthreads);
}

typedef struct {
    const uint8_t *w[4];   /* qkv, o, gate_up, down blocks */
    int fmt[4];
    const float *qkv_bias; /* (H + 2 Hkv) * D, or NULL */
    const float *norm_in, *norm_post;
    float *k_cache, *v_cache; /* (B, Hkv, max_len, D) */
} layer_t;

/* exp(x) as one fixed sequence of IEEE operations (Cephes' expf: x = n ln2 + r, a degree-7 polynomial
 * in r, times 2^n; within 2 ulp of expf), in a scalar and a vector form that give the same bits, so
 * that SiLU and softmax run in vector lanes and a row's result still does not depend on where its
 * elements fall (lanes or the scalar tail). Plain mul/add, no FMA (-ffp-contract=off). */
#define EXP_HI 88.0f
#define EXP_LO -87.0f
static const float EXP_C[] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f,
                              1.6666665459E-1f, 5.0000001201E-1f};
static inline float exp_fixed(float x) {
    x = x > EXP_HI ? EXP_HI : x < EXP_LO ? EXP_LO : x;
    const float n = nearbyintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = EXP_C[0];
    for (int i = 1; i < 6; i++) p = p * r + EXP_C[i];
    p = (p * (r * r) + r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}
static inline vf vexp_fixed(vf x) {
#if LANES == 16
    x = _mm512_min_ps(_mm512_max_ps(x, VSET1(EXP_LO)), VSET1(EXP_HI));
    const __m512 n = _mm512_roundscale_ps(VMUL(x, VSET1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, VMUL(n, VSET1(0.693359375f))), VMUL(n, VSET1(-2.12194440e-4f)));
    __m512 p = VSET1(EXP_C[0]);
    for (int i = 1; i < 6; i++) p = _mm512_add_ps(VMUL(p, r), VSET1(EXP_C[i]));
    p = _mm512_add_ps(_mm512_add_ps(VMUL(p, VMUL(r, r)), r), VSET1(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return VMUL(p, _mm512_castsi512_ps(e));
#else
    x = _mm256_min_ps(_mm256_max_ps(x, VSET1(EXP_LO)), VSET1(EXP_HI));
    const __m256 n = _mm256_round_ps(VMUL(x, VSET1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, VMUL(n, VSET1(0.693359375f))), VMUL(n, VSET1(-2.12194440e-4f)));
    __m256 p = VSET1(EXP_C[0]);
    for (int i = 1; i < 6; i++) p = _mm256_add_ps(VMUL(p, r), VSET1(EXP_C[i]));
    p = _mm256_add_ps(_mm256_add_ps(VMUL(p, VMUL(r, r)), r), VSET1(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return VMUL(p, _mm256_castsi256_ps(e));
#endif
}

/* g = silu(g) * u, element-wise: g / (1 + exp(-g)) * u. */
static void silu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        vf gv = VLOAD(g + i);
        vf den = VADD(VSET1(1.0f), vexp_fixed(VSUB(VZERO(), gv)));
        VSTORE(g + i, VMUL(VDIV(gv, den), VLOAD(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + exp_fixed(-g[i])) * u[i];
}

/* Row-wise work is spread over the threads only for long steps (prefill): a row's arithmetic is the
 * same whichever thread does it. */
#define PAR_ROWS 16
static void rmsnorm_rows(const float *x, const float *w, float eps, float *out, int M, int K, int nthreads) {
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_ROWS)")
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * K;
        float ss = 0.0f;
        for (int k = 0; k < K; k++) ss += xr[k] * xr[k];
        float r = 1.0f / sqrtf(ss / (float)K + eps);
        for (int k = 0; k < K; k++) out[(size_t)m * K + k] = w[k] * (xr[k] * r);
    }
}

static void add_rows(float *x, const float *y, int M, int K, int nthreads) {
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_ROWS)")
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) x[(size_t)m * K + k] += y[(size_t)m * K + k];
}

/* HF's half-split rotation: out = x * cos + concat(-x[D/2:], x[:D/2]) * sin, in place. */
static void rope_row(float *x, const float *cs, const float *sn, int D) {
    int h = D / 2;
    float tmp[512];
    for (int i = 0; i < D; i++) tmp[i] = x[i];
    for (int i = 0; i < h; i++) x[i] = tmp[i] * cs[i] + (-tmp[i + h]) * sn[i];
    for (int i = h; i < D; i++) x[i] = tmp[i] * cs[i] + tmp[i - h] * sn[i];
}

/* q . k over D, in vector lanes when D is a multiple of the lane count (a fixed order either way). */
static inline float dot(const float *q, const float *k, int D) {
    if (D % LANES == 0) {
        vf acc = VMUL(VLOAD(q), VLOAD(k));
        for (int i = LANES; i < D; i += LANES) acc = VFMA(VLOAD(q + i), VLOAD(k + i), acc);
        return vsum(acc);
    }
    float d = 0.0f;
    for (int i = 0; i < D; i++) d += q[i] * k[i];
    return d;
}

/* q . k_j for LANES keys at once (fewer when n < LANES): each key's D products summed in lanes as
 * dot() does, then the LANES vectors reduced together by a transposing tree that sums every key's
 * lanes in one fixed order, the same for each key and wherever it sits in the block (~3 operations a
 * key instead of a full horizontal sum each). */
static inline void dots_block(const float *q, const float *K, const size_t *off, int D, int n, float *out) {
    vf v[LANES];
    for (int j = 0; j < LANES; j++) {
        if (j >= n) { v[j] = VZERO(); continue; }
        const float *k = K + off[j];
        vf acc = VMUL(VLOAD(q), VLOAD(k));
        for (int i = LANES; i < D; i += LANES) acc = VFMA(VLOAD(q + i), VLOAD(k + i), acc);
        v[j] = acc;
    }
#if LANES == 16
    __m512 c[8], e[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: elements (0 + 2), (1 + 3) of keys 2i, 2i + 1 */
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: the lane's 4 elements of keys 4i .. 4i + 3 */
        __m512d a = _mm512_castps_pd(c[2 * i]), b = _mm512_castps_pd(c[2 * i + 1]);
        e[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* Across the four 128-bit lanes: (L0 + L1) and (L2 + L3), then their sum. */
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xdd));
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(e[2], e[3], 0x88), _mm512_shuffle_f32x4(e[2], e[3], 0xdd));
    __m512 r = _mm512_add_ps(_mm512_shuffle_f32x4(t, u, 0x88), _mm512_shuffle_f32x4(t, u, 0xdd));
#else
    __m256 c[4], e[2];
    for (int i = 0; i < 4; i++)
        c[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++) {
        __m256d a = _mm256_castps_pd(c[2 * i]), b = _mm256_castps_pd(c[2 * i + 1]);
        e[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(e[0], e[1], 0x20), _mm256_permute2f128_ps(e[0], e[1], 0x31));
#endif
    if (n >= LANES) VSTORE(out, r);
    else {
        float tmp[LANES];
        VSTORE(tmp, r);
        for (int j = 0; j < n; j++) out[j] = tmp[j];
    }
}

/* Query heads that share a KV head, attended together (one task): each key and value row is loaded once for
 * all of them, and their softmax sums and output accumulators form independent chains, so the adds and FMAs of
 * one head wait on their own previous result while the others' issue (one head alone was bound by those
 * latencies: a 64-wide head over 256 keys is a chain of 256 dependent adds, then one of 256 FMAs per vector).
 * Every head's own arithmetic is unchanged, element for element and in key order: the same bits as one head
 * at a time, for any chunking. */
#define HEADS_PER_TASK 4
/* v where the mask byte is nonzero, else -inf (LANES mask bytes from m). */
static inline vf visible_or_neg_inf(vf v, const uint8_t *m) {
#if LANES == 16
    const __mmask16 k = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)m)),
                                               _mm512_set1_epi32(0xff));
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), v);
#else
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m));
    const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    return _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), hidden);
#endif
}
/* One head's scores, scaled and masked, then exp(s - max): sc[0 .. upto). */
static inline void head_scores(const float *q, const float *K, const size_t *off, int upto, const uint8_t *mrow,
                               float scale, int D, float *sc) {
    float mx = -INFINITY;
    if (D % LANES == 0)
        for (int j = 0; j < upto; j += LANES) dots_block(q, K, off + j, D, upto - j, sc + j);
    else
        for (int j = 0; j < upto; j++) sc[j] = dot(q, K + off[j], D);
    /* Scale, mask, max: element-wise (the max is exact in any order), in lanes. */
    int jv = 0;
    {
        vf vmx = VSET1(-INFINITY);
        for (; jv + LANES <= upto; jv += LANES) {
            vf v = VMUL(VLOAD(sc + jv), VSET1(scale));
            if (mrow) v = visible_or_neg_inf(v, mrow + jv); /* masked keys: -inf, as the scalar loop sets them */
            VSTORE(sc + jv, v);
            vmx = VMAX(vmx, v);
        }
        float lanes[LANES];
        VSTORE(lanes, vmx);
        for (int i = 0; i < LANES; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    }
    for (int j = jv; j < upto; j++) {
        if (mrow && !mrow[j]) { sc[j] = -INFINITY; continue; }
        sc[j] *= scale;
        if (sc[j] > mx) mx = sc[j];
    }
    /* Masked scores are -inf; exp_fixed clamps, so they are zeroed explicitly. */
    int j0 = 0;
    for (; j0 + LANES <= upto; j0 += LANES) {
        vf v = VLOAD(sc + j0);
        VSTORE(sc + j0, VMASKINF(v, vexp_fixed(VSUB(v, VSET1(mx)))));
    }
    for (; j0 < upto; j0++) sc[j0] = sc[j0] == -INFINITY ? 0.0f : exp_fixed(sc[j0] - mx);
}
/* o_i = sum_j p_ij v_j for nh_ heads of nv_ vectors each (compile-time in every call below), the accumulators in registers: key by key, o += p * v
 * (one FMA a vector), keys with p = 0 skipped, as the one-head loop did. */
static inline __attribute__((always_inline)) void heads_pv(const float *sc, int S, const float *V, const size_t *off,
                                                           int upto, int nh_, int nv_, float *o, int D) {
    vf acc[HEADS_PER_TASK][16];
    for (int i = 0; i < nh_; i++)
        for (int v = 0; v < nv_; v++) acc[i][v] = VZERO();
    for (int j = 0; j < upto; j++) {
        const float *vr = V + off[j];
        for (int i = 0; i < nh_; i++) {
            const float p = sc[(size_t)i * S + j];
            if (p == 0.0f) continue;
            const vf pv = VSET1(p);
            for (int v = 0; v < nv_; v++) acc[i][v] = VFMA(pv, VLOAD(vr + v * LANES), acc[i][v]);
        }
    }
    for (int i = 0; i < nh_; i++)
        for (int v = 0; v < nv_; v++) VSTORE(o + (size_t)i * D + v * LANES, acc[i][v]);
}
/* nh (<= HEADS_PER_TASK) consecutive query heads q[i * D ..] of one row against one KV head's keys: out[i * D ..]. */
static void attend_heads(const float *q, const float *K, const float *V, const size_t *off, int upto,
                         const uint8_t *mrow, float scale, int D, int nh, int S, float *sc, float *out) {
    for (int i = 0; i < nh; i++) head_scores(q + (size_t)i * D, K, off, upto, mrow, scale, D, sc + (size_t)i * S);
    float sum[HEADS_PER_TASK] = {0.0f, 0.0f, 0.0f, 0.0f};
    switch (nh) { /* each head's sum in key order; the heads' chains interleaved */
        case 4: for (int j = 0; j < upto; j++) { sum[0] += sc[j]; sum[1] += sc[S + j]; sum[2] += sc[2 * S + j]; sum[3] += sc[3 * S + j]; } break;
        case 3: for (int j = 0; j < upto; j++) { sum[0] += sc[j]; sum[1] += sc[S + j]; sum[2] += sc[2 * S + j]; } break;
        case 2: for (int j = 0; j < upto; j++) { sum[0] += sc[j]; sum[1] += sc[S + j]; } break;
        default: for (int j = 0; j < upto; j++) sum[0] += sc[j]; break;
    }
    if (D % LANES == 0 && D <= 16 * LANES) {
        for (int i = 0; i < nh; i++) { /* p_j = e_j / sum, element-wise in lanes (IEEE division: the scalar bits) */
            float *si = sc + (size_t)i * S;
            int jd = 0;
            for (; jd + LANES <= upto; jd += LANES) VSTORE(si + jd, VDIV(VLOAD(si + jd), VSET1(sum[i])));
            for (; jd < upto; jd++) si[jd] = si[jd] / sum[i];
        }
        const int nv = D / LANES;
        /* register-resident forms for the common widths (64 and 128 dims); any other width in heads of one */
        switch (nh * 100 + nv) {
            case 104: heads_pv(sc, S, V, off, upto, 1, 4, out, D); break;
            case 204: heads_pv(sc, S, V, off, upto, 2, 4, out, D); break;
            case 304: heads_pv(sc, S, V, off, upto, 3, 4, out, D); break;
            case 404: heads_pv(sc, S, V, off, upto, 4, 4, out, D); break;
            case 108: heads_pv(sc, S, V, off, upto, 1, 8, out, D); break;
            case 208: heads_pv(sc, S, V, off, upto, 2, 8, out, D); break;
            default:
                for (int i = 0; i < nh; i++) heads_pv(sc + (size_t)i * S, S, V, off, upto, 1, nv, out + (size_t)i * D, D);
        }
    } else {
        for (int i = 0; i < nh; i++) {
            float *o = out + (size_t)i * D;
            const float *si = sc + (size_t)i * S;
            for (int d = 0; d < D; d++) o[d] = 0.0f;
            for (int j = 0; j < upto; j++) {
                float p = si[j] / sum[i];
                if (p != 0.0f)
                    for (int d = 0; d < D; d++) o[d] += p * V[off[j] + d];
            }
        }
    }
}

/* Where the keys live. NULL: the dense cache, (B, Hkv, max_len, D), row (b, t) at position s + t.
 * Else the paged pool, slot-major (slots, Hkv, D): x's rows are nseq sequences' new tokens back to back
 * (tok_off), sequence i has cached[i] tokens before them, and its slots in position order are
 * k_slots[slot_off[i] ...]. Both layouts go through the same arithmetic: a row attends to the same keys
 * in the same order either way, so the serving engine's rows have the bits of single-request decoding. */
typedef struct {
    int nseq;
    const int64_t *tok_off, *cached, *k_slots, *slot_off;
} kvmap_t;

int decode_layers(
        int L, const layer_t *layers, float *x /* (B*T, hid), updated in place */,
        int B, int T, int hid, int H, int Hkv, int D, int inter, float eps,
        const float *cos_t, const float *sin_t /* (B, T, D), or (M, D) when paged */,
        int s, int max_len, const uint8_t *mask, int nthreads, const kvmap_t *pg,
        float *const *hidden /* NULL, or per layer NULL or an (M, hid) buffer for its output */) {
    const int M = pg ? (int)pg->tok_off[pg->nseq] : B * T, QKV = (H + 2 * Hkv) * D, grp = H / Hkv;
    if (D > 512 || (!pg && s + T > max_len) || (pg && mask)) return -2;
    /* Per row: its sequence, the keys it sees (upto), where its keys start (kbase, for the head-0 slot
     * of position 0 in the dense layout) and its own slot (write). */
    int *seq = malloc(sizeof(int) * (size_t)M + 1), *upto_of = malloc(sizeof(int) * (size_t)M + 1);
    size_t *write = malloc(sizeof(size_t) * (size_t)M + 1);
    int S = 0;
    if (seq && upto_of && write)
        for (int m = 0; m < M; m++) {
            if (pg) {
                int i = 0;
                while (pg->tok_off[i + 1] <= m) i++;
                const int t = m - (int)pg->tok_off[i], pos = (int)pg->cached[i] + t;
                seq[m] = i;
                upto_of[m] = pos + 1;
                write[m] = (size_t)pg->k_slots[pg->slot_off[i] + pos] * Hkv * D;
            } else {
                const int b = m / T, t = m % T;
                seq[m] = b;
                upto_of[m] = mask ? s + T : s + t + 1;
                write[m] = ((size_t)b * Hkv * max_len + s + t) * D;
            }
            S = upto_of[m] > S ? upto_of[m] : S;
        }
    const size_t head_stride = pg ? (size_t)D : (size_t)max_len * D; /* between KV heads of one slot */
    float *h = malloc(sizeof(float) * (size_t)M * (hid > H * D ? hid : H * D));
    float *qkv = malloc(sizeof(float) * (size_t)M * QKV);
    float *att = malloc(sizeof(float) * (size_t)M * H * D);
    float *gu = malloc(sizeof(float) * (size_t)M * 2 * inter);
    float *out = malloc(sizeof(float) * (size_t)M * hid);
    float *scores = malloc(sizeof(float) * (size_t)nthreads * HEADS_PER_TASK * S + 1);
    size_t *offs = malloc(sizeof(size_t) * (size_t)nthreads * (S + LANES) + 1);
    int rc = (h && qkv && att && gu && out && scores && offs && seq && upto_of && write) ? 0 : -1;
    const float scale = 1.0f / sqrtf((float)D);
    for (int l = 0; l < L && !rc; l++) {
        const layer_t *ly = layers + l;
        rmsnorm_rows(x, ly->norm_in, eps, h, M, hid, nthreads);
        rc |= linear(ly->fmt[0], h, hid, ly->w[0], ly->qkv_bias, qkv, M, hid, QKV, nthreads);
        /* RoPE, then the new keys and values into their cache slots. */
        _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_ROWS)")
        for (int m = 0; m < M; m++) {
            float *row = qkv + (size_t)m * QKV;
            const float *cs = cos_t + (size_t)m * D, *sn = sin_t + (size_t)m * D;
            for (int hh = 0; hh < H + Hkv; hh++) rope_row(row + hh * D, cs, sn, D);
            for (int g = 0; g < Hkv; g++) {
                memcpy(ly->k_cache + write[m] + g * head_stride, row + (H + g) * D, sizeof(float) * D);
                memcpy(ly->v_cache + write[m] + g * head_stride, row + (H + Hkv + g) * D, sizeof(float) * D);
            }
        }
        /* Attention: one (row, KV head, chunk of up to HEADS_PER_TASK of its query heads) per task; scores in
         * fp32, max-subtracted softmax (attend_heads). */
        /* A one-row step goes head by head: its H tasks spread over the threads, which Hkv grouped tasks would
         * not (3 on 2 threads for SmolLM2-135M). Either way each head's bits are the same. */
        const int per_task = M == 1 ? 1 : grp < HEADS_PER_TASK ? grp : HEADS_PER_TASK;
        const int chunks = (grp + per_task - 1) / per_task;
        _Pragma("omp parallel for num_threads(nthreads) schedule(static)")
        for (int task = 0; task < M * Hkv * chunks; task++) {
            const int m = task / (Hkv * chunks), g = task / chunks % Hkv, h0 = g * grp + task % chunks * per_task;
            const int nh = g * grp + grp - h0 < per_task ? g * grp + grp - h0 : per_task, upto = upto_of[m];
            float *sc = scores + (size_t)omp_get_thread_num() * HEADS_PER_TASK * S;
            size_t *off = offs + (size_t)omp_get_thread_num() * (S + LANES);
            const float *K, *V;
            if (pg) {
                const int64_t *sl = pg->k_slots + pg->slot_off[seq[m]];
                for (int j = 0; j < upto; j++) off[j] = (size_t)sl[j] * Hkv * D;
                K = ly->k_cache + g * head_stride;
                V = ly->v_cache + g * head_stride;
            } else {
                for (int j = 0; j < upto; j++) off[j] = (size_t)j * D;
                K = ly->k_cache + ((size_t)seq[m] * Hkv + g) * max_len * D;
                V = ly->v_cache + ((size_t)seq[m] * Hkv + g) * max_len * D;
            }
            attend_heads(qkv + (size_t)m * QKV + h0 * D, K, V, off, upto, mask ? mask + (size_t)m * upto : NULL,
                         scale, D, nh, S, sc, att + (size_t)m * H * D + h0 * D);
        }
        rc |= linear(ly->fmt[1], att, H * D, ly->w[1], NULL, out, M, H * D, hid, nthreads);
        add_rows(x, out, M, hid, nthreads);
        rmsnorm_rows(x, ly->norm_post, eps, h, M, hid, nthreads);
        rc |= linear(ly->fmt[2], h, hid, ly->w[2], NULL, gu, M, hid, 2 * inter, nthreads);
        _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_ROWS)")
        for (int m = 0; m < M; m++) {
            float *g = gu + (size_t)m * 2 * inter, *u = g + inter;
            silu_mul(g, u, inter);
        }
        /* The down projection reads the gate half in place: its rows sit 2 * inter apart. */
        rc |= linear(ly->fmt[3], gu, 2 * inter, ly->w[3], NULL, out, M, inter, hid, nthreads);
        add_rows(x, out, M, hid, nthreads);
        if (hidden && hidden[l]) memcpy(hidden[l], x, sizeof(float) * (size_t)M * hid); /* EAGLE-3's features */
    }
    free(h); free(qkv); free(att); free(gu); free(out); free(scores); free(offs); free(seq); free(upto_of);
    free(write);
    return rc;
}
