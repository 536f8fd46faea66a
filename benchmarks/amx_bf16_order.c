/* Which fp32 order do the bf16 dot-product instructions sum in? (why --act bf16 has no AMX path)
 *
 * Build and run (on a CPU with avx512_bf16; the AMX part needs amx_bf16):
 *   gcc -O2 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 -ffp-contract=off benchmarks/amx_bf16_order.c -o /tmp/o -lm && /tmp/o
 *
 * For random bf16 operands (and small integers, as block weights are) it compares each instruction's
 * fp32 results with candidate sequences of fp32 roundings (products of two bf16 are exact in fp32):
 *   vdpbf16ps (one pair per lane):   odd-first (acc + p1) + p0;  even-first;  one rounding;  pair sum first
 *   TDPBF16PS (16 pairs per output): even-first per pair in k order; odd-first; one rounding of the exact
 *                                    sum; the pair sum first
 * A count of 0 means the instruction computes exactly that sequence. bf16_linear.c's definition is the
 * one vdpbf16ps matches; where no candidate matches TDPBF16PS, AMX cannot give the same bits.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static uint32_t rng = 12345;
static uint32_t xr(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float rf(void) { return ldexpf(((int)(xr() % 2000001) - 1000000) / 1e6f, (int)(xr() % 20) - 10); }
typedef struct { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;

int main(void) {
    const int N = 200000;
    long bad[4] = {0};
    for (int t = 0; t < N; t++) {
        uint16_t a[32], b[32];
        float acc[16], o[16];
        for (int i = 0; i < 32; i++) { a[i] = tobf(rf()); b[i] = (t & 1) ? tobf((float)(xr() % 16)) : tobf(rf()); }
        for (int i = 0; i < 16; i++) acc[i] = (t & 2) ? rf() : 0.0f;
        _mm512_storeu_ps(o, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a),
                                             (__m512bh)_mm512_loadu_si512(b)));
        for (int i = 0; i < 16; i++) {
            const float p0 = bf(a[2 * i]) * bf(b[2 * i]), p1 = bf(a[2 * i + 1]) * bf(b[2 * i + 1]);
            const float e[4] = {(acc[i] + p1) + p0, (acc[i] + p0) + p1, (float)((double)acc[i] + p0 + p1), acc[i] + (p0 + p1)};
            for (int k = 0; k < 4; k++) bad[k] += memcmp(&e[k], &o[i], 4) != 0;
        }
    }
    printf("vdpbf16ps, %d lanes: mismatches odd-first %ld, even-first %ld, one rounding %ld, pair sum first %ld\n",
           N * 16, bad[0], bad[1], bad[2], bad[3]);
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("TDPBF16PS: no AMX on this CPU\n"); return 0; }
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 3; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
    long ab[4] = {0};
    const int T = 2000;
    static uint16_t A[16][32], Bm[16][32];
    static float C[16][16], O[16][16];
    for (int t = 0; t < T; t++) {
        for (int m = 0; m < 16; m++) for (int k = 0; k < 32; k++) A[m][k] = tobf(rf());
        for (int k = 0; k < 16; k++) for (int n = 0; n < 32; n++) Bm[k][n] = (t & 1) ? tobf((float)(xr() % 16)) : tobf(rf());
        for (int m = 0; m < 16; m++) for (int n = 0; n < 16; n++) C[m][n] = (t & 2) ? rf() : 0.0f;
        _tile_loadd(0, C, 64); _tile_loadd(1, A, 64); _tile_loadd(2, Bm, 64);
        _tile_dpbf16ps(0, 1, 2);
        _tile_stored(0, O, 64);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                float e0 = C[m][n], e1 = C[m][n], e3 = C[m][n];
                double d = C[m][n];
                for (int k = 0; k < 16; k++) {
                    const float p0 = bf(A[m][2 * k]) * bf(Bm[k][2 * n]), p1 = bf(A[m][2 * k + 1]) * bf(Bm[k][2 * n + 1]);
                    e0 = (e0 + p0) + p1; e1 = (e1 + p1) + p0; e3 = e3 + (p0 + p1); d += (double)p0 + p1;
                }
                const float e[4] = {e0, e1, (float)d, e3};
                for (int k = 0; k < 4; k++) ab[k] += memcmp(&e[k], &O[m][n], 4) != 0;
            }
    }
    _tile_release();
    printf("TDPBF16PS, %d outputs: mismatches even-first %ld, odd-first %ld, one rounding %ld, pair sum first %ld\n",
           T * 256, ab[0], ab[1], ab[2], ab[3]);
    return 0;
}
