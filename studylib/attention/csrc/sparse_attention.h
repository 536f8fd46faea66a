// Hand-written CUDA kernels for sparse attention (studylib chapter 6). Plain CUDA C++: no torch
// headers here, so `nvcc -c sparse_attention.cu` builds on any machine with the CUDA toolkit; the
// torch binding (binding.cpp) only fills these argument structs.
//
// Shapes: q (B, H, Tq, D), k and v (B, Hkv, Tk, D), out like q; head_dim contiguous. Queries are
// the last Tq positions; attention is causal; a query with no visible key outputs 0.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace studylib {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

struct Strides3 {  // element strides of dims 0..2 (batch, head, token); dim 3 has stride 1
  int64_t b, h, t;
};

// Sliding-window / sinks decode: one query token (Tq = 1). window = 0 means dense. The keys
// visited are exactly [0, min(S, lo)) and [lo, Tk) with lo = Tk - window, so the work is
// O(S + W) whatever Tk is. With splits > 1 each (batch, head) is cut into `splits` CTAs along
// the keys (flash-decoding); a second kernel merges their partial softmax states.
struct DecodeArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* part_acc;  // (B*H, splits, D) workspace, used when splits > 1
  float* part_ml;   // (B*H, splits, 2) running max and sum per split
  int B, H, Hkv, Tk, D;
  Strides3 sq, sk, sv, so;
  int window, sinks, splits;
  float scale;
};

// Block-sparse (or any pattern) prefill: FlashAttention-2 loop over a host-built tile table.
// Query tile t (kPrefillBlockM rows) visits key tiles tile_idx[t, 0 .. tile_cnt[t]) of
// kPrefillBlockN keys each; inside a tile the token-level rule (causal, window/sinks, and the
// block layout when layout != nullptr) is applied exactly.
struct PrefillArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int32_t* tile_idx;  // (n_qtiles, max_tiles)
  const int32_t* tile_cnt;  // (n_qtiles,)
  int max_tiles;
  const int8_t* layout;  // (n_lblocks, n_lblocks) block visibility, or nullptr
  int n_lblocks, lblock;
  int B, H, Hkv, Tq, Tk, D;
  Strides3 sq, sk, sv, so;
  int window, sinks;
  float scale;
};

constexpr int kPrefillBlockM = 64;
constexpr int kPrefillBlockN = 64;

// Both return cudaSuccess or the launch error. Supported: D in {64, 128}; F32, F16, BF16.
cudaError_t launch_window_decode(DType dtype, const DecodeArgs& args, cudaStream_t stream);
cudaError_t launch_sparse_prefill(DType dtype, const PrefillArgs& args, cudaStream_t stream);

}  // namespace studylib
