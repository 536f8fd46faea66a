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
 * Mask: NULL means causal (row t sees slots [0, s + t]); else uint8 (B, T, s + T), 1 = visible.
 */
#include <math.h>
#include <omp.h>

#include "quant_linear.c"

typedef struct {
    const uint8_t *w[4];   /* qkv, o, gate_up, down blocks */
    int fmt[4];
    const float *qkv_bias; /* (H + 2 Hkv) * D, or NULL */
    const float *norm_in, *norm_post;
    float *k_cache, *v_cache; /* (B, Hkv, max_len, D) */
} layer_t;

static void rmsnorm_rows(const float *x, const float *w, float eps, float *out, int M, int K) {
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * K;
        float ss = 0.0f;
        for (int k = 0; k < K; k++) ss += xr[k] * xr[k];
        float r = 1.0f / sqrtf(ss / (float)K + eps);
        for (int k = 0; k < K; k++) out[(size_t)m * K + k] = w[k] * (xr[k] * r);
    }
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

int decode_layers(
        int L, const layer_t *layers, float *x /* (B*T, hid), updated in place */,
        int B, int T, int hid, int H, int Hkv, int D, int inter, float eps,
        const float *cos_t, const float *sin_t /* (B, T, D) */,
        int s, int max_len, const uint8_t *mask, int nthreads) {
    const int M = B * T, S = s + T, QKV = (H + 2 * Hkv) * D, grp = H / Hkv;
    if (D > 512 || s + T > max_len) return -2;
    float *h = malloc(sizeof(float) * (size_t)M * (hid > H * D ? hid : H * D));
    float *qkv = malloc(sizeof(float) * (size_t)M * QKV);
    float *att = malloc(sizeof(float) * (size_t)M * H * D);
    float *gu = malloc(sizeof(float) * (size_t)M * 2 * inter);
    float *out = malloc(sizeof(float) * (size_t)M * hid);
    float *scores = malloc(sizeof(float) * (size_t)nthreads * S + 1);
    int rc = (h && qkv && att && gu && out && scores) ? 0 : -1;
    const float scale = 1.0f / sqrtf((float)D);
    for (int l = 0; l < L && !rc; l++) {
        const layer_t *ly = layers + l;
        rmsnorm_rows(x, ly->norm_in, eps, h, M, hid);
        rc |= quant_linear(ly->fmt[0], h, hid, ly->w[0], ly->qkv_bias, qkv, M, hid, QKV, nthreads);
        /* RoPE, then the new keys and values into their cache slots. */
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                float *row = qkv + (size_t)(b * T + t) * QKV;
                const float *cs = cos_t + (size_t)(b * T + t) * D, *sn = sin_t + (size_t)(b * T + t) * D;
                for (int hh = 0; hh < H + Hkv; hh++) rope_row(row + hh * D, cs, sn, D);
                for (int g = 0; g < Hkv; g++) {
                    size_t slot = (((size_t)b * Hkv + g) * max_len + s + t) * D;
                    memcpy(ly->k_cache + slot, row + (H + g) * D, sizeof(float) * D);
                    memcpy(ly->v_cache + slot, row + (H + Hkv + g) * D, sizeof(float) * D);
                }
            }
        /* Attention: one (row, head) per task; scores in fp32, max-subtracted softmax. */
        _Pragma("omp parallel for num_threads(nthreads) schedule(static)")
        for (int task = 0; task < M * H; task++) {
            int m = task / H, hh = task % H, b = m / T, t = m % T, g = hh / grp;
            float *sc = scores + (size_t)omp_get_thread_num() * S;
            const float *q = qkv + (size_t)m * QKV + hh * D;
            const float *K = ly->k_cache + ((size_t)b * Hkv + g) * max_len * D;
            const float *V = ly->v_cache + ((size_t)b * Hkv + g) * max_len * D;
            const uint8_t *mrow = mask ? mask + ((size_t)b * T + t) * S : NULL;
            int upto = mask ? S : s + t + 1;
            float mx = -INFINITY;
            for (int j = 0; j < upto; j++) {
                if (mrow && !mrow[j]) { sc[j] = -INFINITY; continue; }
                sc[j] = dot(q, K + (size_t)j * D, D) * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            float sum = 0.0f;
            for (int j = 0; j < upto; j++) {
                sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mx);
                sum += sc[j];
            }
            float *o = att + (size_t)m * H * D + hh * D;
            for (int i = 0; i < D; i++) o[i] = 0.0f;
            for (int j = 0; j < upto; j++) {
                float p = sc[j] / sum;
                if (p != 0.0f)
                    for (int i = 0; i < D; i++) o[i] += p * V[(size_t)j * D + i];
            }
        }
        rc |= quant_linear(ly->fmt[1], att, H * D, ly->w[1], NULL, out, M, H * D, hid, nthreads);
        for (size_t i = 0; i < (size_t)M * hid; i++) x[i] += out[i];
        rmsnorm_rows(x, ly->norm_post, eps, h, M, hid);
        rc |= quant_linear(ly->fmt[2], h, hid, ly->w[2], NULL, gu, M, hid, 2 * inter, nthreads);
        for (int m = 0; m < M; m++) {
            float *g = gu + (size_t)m * 2 * inter, *u = g + inter;
            for (int i = 0; i < inter; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        /* The down projection reads the gate half in place: its rows sit 2 * inter apart. */
        rc |= quant_linear(ly->fmt[3], gu, 2 * inter, ly->w[3], NULL, out, M, inter, hid, nthreads);
        for (size_t i = 0; i < (size_t)M * hid; i++) x[i] += out[i];
    }
    free(h); free(qkv); free(att); free(gu); free(out); free(scores);
    return rc;
}
