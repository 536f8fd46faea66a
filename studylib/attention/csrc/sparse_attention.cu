// Kernels declared in sparse_attention.h. Scalar fp32 arithmetic (no tensor cores): the point is
// a readable FlashAttention-style loop that skips masked work, not peak throughput.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "sparse_attention.h"

namespace studylib {
namespace {

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// exp(x - m) that is 0 when x = -inf, and 0 (not NaN) when both are -inf.
__device__ __forceinline__ float exp_shift(float x, float m) { return x == -CUDART_INF_F ? 0.f : __expf(x - m); }

// ------------------------------------------------------------------------------------------------
// Decode: grid (B*H, splits), 4 warps. Warp w takes keys i0+w, i0+w+4, ... of its split; lane l
// holds head dims l, l+32, ... (coalesced loads, conflict-free shared memory), so one key costs a
// D/32-long partial dot and a 5-step shuffle reduction. Each warp keeps its own online-softmax
// state (m, l, acc); the CTA merges the four, then either writes the output or its partial state.
// ------------------------------------------------------------------------------------------------
constexpr int kDecodeWarps = 4;

template <typename T, int D>
__global__ void __launch_bounds__(kDecodeWarps * 32) window_decode_kernel(DecodeArgs a) {
  constexpr int V = D / 32;
  const int bh = blockIdx.x, split = blockIdx.y;
  const int b = bh / a.H, h = bh % a.H, hk = h / (a.H / a.Hkv);  // GQA: H/Hkv query heads per KV head
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* kb = static_cast<const T*>(a.k) + b * a.sk.b + hk * a.sk.h;
  const T* vb = static_cast<const T*>(a.v) + b * a.sv.b + hk * a.sv.h;

  float qr[V];
#pragma unroll
  for (int c = 0; c < V; ++c) qr[c] = to_f(q[lane + 32 * c]) * a.scale;

  // The visible keys of the query at position Tk - 1, enumerated as i in [0, n).
  const int lo = a.window > 0 ? max(0, a.Tk - a.window) : 0;
  const int ns = a.window > 0 ? min(a.sinks, lo) : 0;
  const int n = ns + (a.Tk - lo);
  const int per = (n + a.splits - 1) / a.splits;
  const int i0 = split * per, i1 = min(n, i0 + per);

  float m = -CUDART_INF_F, l = 0.f, acc[V];
#pragma unroll
  for (int c = 0; c < V; ++c) acc[c] = 0.f;
  for (int i = i0 + warp; i < i1; i += kDecodeWarps) {
    const int64_t key = i < ns ? i : lo + (i - ns);
    const T* kr = kb + key * a.sk.t;
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < V; ++c) s += qr[c] * to_f(kr[lane + 32 * c]);
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float alpha = exp_shift(m, m_new);
    const float p = __expf(s - m_new);
    l = l * alpha + p;
    const T* vr = vb + key * a.sv.t;
#pragma unroll
    for (int c = 0; c < V; ++c) acc[c] = acc[c] * alpha + p * to_f(vr[lane + 32 * c]);
    m = m_new;
  }

  __shared__ float sm_m[kDecodeWarps], sm_l[kDecodeWarps], sm_acc[kDecodeWarps][D];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < V; ++c) sm_acc[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float M = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm_m[w]);
    float L = 0.f, A = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float sc = exp_shift(sm_m[w], M);
      L += sm_l[w] * sc;
      A += sm_acc[w][d] * sc;
    }
    if (a.splits == 1) {
      T* out = static_cast<T*>(a.out) + b * a.so.b + h * a.so.h;
      out[d] = from_f<T>(L > 0.f ? A / L : 0.f);
    } else {
      const int64_t slot = static_cast<int64_t>(bh) * a.splits + split;
      a.part_acc[slot * D + d] = A;
      if (d == 0) {
        a.part_ml[slot * 2] = M;
        a.part_ml[slot * 2 + 1] = L;
      }
    }
  }
}

// Merge the splits of one (batch, head): grid B*H, D threads.
template <typename T>
__global__ void merge_splits_kernel(DecodeArgs a) {
  const int bh = blockIdx.x, d = threadIdx.x;
  const int b = bh / a.H, h = bh % a.H;
  const float* ml = a.part_ml + static_cast<int64_t>(bh) * a.splits * 2;
  const float* acc = a.part_acc + static_cast<int64_t>(bh) * a.splits * a.D;
  float M = -CUDART_INF_F;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, ml[2 * s]);
  float L = 0.f, A = 0.f;
  for (int s = 0; s < a.splits; ++s) {
    const float sc = exp_shift(ml[2 * s], M);
    L += ml[2 * s + 1] * sc;
    A += acc[s * a.D + d] * sc;
  }
  T* out = static_cast<T*>(a.out) + b * a.so.b + h * a.so.h;
  out[d] = from_f<T>(L > 0.f ? A / L : 0.f);
}

// ------------------------------------------------------------------------------------------------
// Prefill: grid (ceil(Tq/BM), B*H), 4 warps, each owning BM/4 query rows. Per live key tile the
// CTA stages K and V in shared memory; then, row by row, lane j scores keys j and j+32 against the
// row's q (a broadcast read), the warp reduces max and sum, and each lane accumulates its head dims
// of P.V. Row state (m, l, acc) lives in shared memory, owned by the row's warp.
// ------------------------------------------------------------------------------------------------
constexpr int kPrefillWarps = 4;
constexpr int BM = kPrefillBlockM, BN = kPrefillBlockN, kRowsPerWarp = BM / kPrefillWarps;
static_assert(BN == 64, "each lane scores keys lane and lane + 32");

__device__ __forceinline__ bool visible(int qpos, int key, const PrefillArgs& a) {
  if (qpos < 0 || key >= a.Tk || key > qpos) return false;
  if (a.window > 0 && key <= qpos - a.window && key >= a.sinks) return false;
  if (a.layout != nullptr) return a.layout[(qpos / a.lblock) * a.n_lblocks + key / a.lblock] != 0;
  return true;
}

template <int D>
constexpr int prefill_smem_floats() {
  // sQ [BM][D] + sK [BN][D+1] + sV [BN][D] + sP [warps][BN] + sAcc [BM][D] + sM, sL [BM]
  return BM * D + BN * (D + 1) + BN * D + kPrefillWarps * BN + BM * D + 2 * BM;
}

template <typename T, int D>
__global__ void __launch_bounds__(kPrefillWarps * 32) sparse_prefill_kernel(PrefillArgs a) {
  constexpr int V = D / 32;
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sK = sQ + BM * D;  // row stride D + 1: lanes read one column of 32 rows without conflicts
  float* sV = sK + BN * (D + 1);
  float* sP = sV + BN * D;
  float* sAcc = sP + kPrefillWarps * BN;
  float* sM = sAcc + BM * D;
  float* sL = sM + BM;

  const int qt = blockIdx.x, bh = blockIdx.y;
  const int b = bh / a.H, h = bh % a.H, hk = h / (a.H / a.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = qt * BM, off = a.Tk - a.Tq;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* kb = static_cast<const T*>(a.k) + b * a.sk.b + hk * a.sk.h;
  const T* vb = static_cast<const T*>(a.v) + b * a.sv.b + hk * a.sv.h;

  for (int i = threadIdx.x; i < BM * D; i += blockDim.x) {
    const int r = i / D, d = i % D, row = row0 + r;
    sQ[i] = row < a.Tq ? to_f(q[row * a.sq.t + d]) * a.scale : 0.f;
    sAcc[i] = 0.f;
  }
  for (int r = threadIdx.x; r < BM; r += blockDim.x) {
    sM[r] = -CUDART_INF_F;
    sL[r] = 0.f;
  }
  __syncthreads();  // row state and sQ are written by all threads but read per warp

  const int n_tiles = a.tile_cnt[qt];
  for (int t = 0; t < n_tiles; ++t) {
    const int col0 = a.tile_idx[static_cast<int64_t>(qt) * a.max_tiles + t] * BN;
    if (t > 0) __syncthreads();  // every warp is done with the previous tile's sK and sV
    for (int i = threadIdx.x; i < BN * D; i += blockDim.x) {
      const int j = i / D, d = i % D;
      const int64_t key = col0 + j;
      const bool in = key < a.Tk;
      sK[j * (D + 1) + d] = in ? to_f(kb[key * a.sk.t + d]) : 0.f;
      sV[i] = in ? to_f(vb[key * a.sv.t + d]) : 0.f;
    }
    __syncthreads();
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, row = row0 + r;
      const int qpos = row < a.Tq ? off + row : -1;
      const float* qrow = sQ + r * D;
      float s0 = 0.f, s1 = 0.f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float qd = qrow[d];
        s0 += qd * sK[lane * (D + 1) + d];
        s1 += qd * sK[(lane + 32) * (D + 1) + d];
      }
      s0 = visible(qpos, col0 + lane, a) ? s0 : -CUDART_INF_F;
      s1 = visible(qpos, col0 + lane + 32, a) ? s1 : -CUDART_INF_F;
      const float m_old = sM[r];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
      if (m_new == -CUDART_INF_F) continue;  // nothing visible to this row yet (warp-uniform)
      const float alpha = exp_shift(m_old, m_new);
      const float p0 = exp_shift(s0, m_new), p1 = exp_shift(s1, m_new);
      const float psum = warp_sum(p0 + p1);
      sP[warp * BN + lane] = p0;
      sP[warp * BN + lane + 32] = p1;
      __syncwarp();
      float acc[V];
#pragma unroll
      for (int c = 0; c < V; ++c) acc[c] = sAcc[r * D + lane + 32 * c] * alpha;
      for (int j = 0; j < BN; ++j) {
        const float p = sP[warp * BN + j];
#pragma unroll
        for (int c = 0; c < V; ++c) acc[c] += p * sV[j * D + lane + 32 * c];
      }
#pragma unroll
      for (int c = 0; c < V; ++c) sAcc[r * D + lane + 32 * c] = acc[c];
      __syncwarp();  // every lane has read sM[r] and sP before lane 0 overwrites them
      if (lane == 0) {
        sM[r] = m_new;
        sL[r] = sL[r] * alpha + psum;
      }
      __syncwarp();
    }
  }
  __syncwarp();  // lane 0's last sL write is visible to the whole warp
  T* out = static_cast<T*>(a.out) + b * a.so.b + h * a.so.h;
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr, row = row0 + r;
    if (row >= a.Tq) break;
    const float L = sL[r];
#pragma unroll
    for (int c = 0; c < V; ++c) out[row * a.so.t + lane + 32 * c] = from_f<T>(L > 0.f ? sAcc[r * D + lane + 32 * c] / L : 0.f);
  }
}

template <typename T, int D>
cudaError_t decode_for(const DecodeArgs& a, cudaStream_t stream) {
  dim3 grid(a.B * a.H, a.splits);
  window_decode_kernel<T, D><<<grid, kDecodeWarps * 32, 0, stream>>>(a);
  if (a.splits > 1) merge_splits_kernel<T><<<a.B * a.H, D, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t prefill_for(const PrefillArgs& a, cudaStream_t stream) {
  constexpr size_t bytes = prefill_smem_floats<D>() * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(sparse_prefill_kernel<T, D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  dim3 grid((a.Tq + BM - 1) / BM, a.B * a.H);
  sparse_prefill_kernel<T, D><<<grid, kPrefillWarps * 32, bytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t decode_dim(const DecodeArgs& a, cudaStream_t s) {
  if (a.D == 64) return decode_for<T, 64>(a, s);
  if (a.D == 128) return decode_for<T, 128>(a, s);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t prefill_dim(const PrefillArgs& a, cudaStream_t s) {
  if (a.D == 64) return prefill_for<T, 64>(a, s);
  if (a.D == 128) return prefill_for<T, 128>(a, s);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_window_decode(DType dtype, const DecodeArgs& a, cudaStream_t stream) {
  switch (dtype) {
    case DType::F32: return decode_dim<float>(a, stream);
    case DType::F16: return decode_dim<__half>(a, stream);
    case DType::BF16: return decode_dim<__nv_bfloat16>(a, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_sparse_prefill(DType dtype, const PrefillArgs& a, cudaStream_t stream) {
  switch (dtype) {
    case DType::F32: return prefill_dim<float>(a, stream);
    case DType::F16: return prefill_dim<__half>(a, stream);
    case DType::BF16: return prefill_dim<__nv_bfloat16>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace studylib
