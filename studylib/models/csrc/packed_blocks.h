/* What the activation kernels (int8_linear.c, bf16_linear.c) share: the GGML formats they take, the
 * packed weight record's size and layout (16 weight rows per group, per block of 32 columns one record
 * d[16] fp16 | m[16] fp16 (Q4_1 only) | quants), and an exact fp16 -> fp32 conversion without F16C (the
 * scalar builds run anywhere). Each kernel arranges the quants inside a record its own way. */
#ifndef STUDYLIB_PACKED_BLOCKS_H
#define STUDYLIB_PACKED_BLOCKS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QK 32
#define GN 16 /* weight rows per group */
enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };

static inline int quant_bytes(int fmt) { return fmt == Q8_0 ? 512 : 256; }
static inline int record_bytes(int fmt) { return (fmt == Q4_1 ? 64 : 32) + quant_bytes(fmt); }
static inline int qoff(int fmt) { return fmt == Q4_1 ? 64 : 32; }
static inline size_t packed_bytes(int fmt, int N, int K) {
    return (size_t)((N + GN - 1) / GN) * (K / QK) * record_bytes(fmt);
}

static inline float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
    if (e == 0) {
        if (m == 0) bits = s;
        else { /* subnormal: renormalise */
            e = 127 - 15 + 1;
            while (!(m & 1024)) { m <<= 1; e--; }
            bits = s | (e << 23) | ((m & 1023) << 13);
        }
    } else if (e == 31) bits = s | 0x7f800000u | (m << 13);
    else bits = s | ((e + 127 - 15) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif
