// PyTorch binding for the kernels in sparse_attention.cu: checks tensors, fills the argument
// structs, launches on the current stream. Built by torch.utils.cpp_extension.load (see
// studylib/attention/cuda_backend.py).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "sparse_attention.h"

namespace {

studylib::DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return studylib::DType::F32;
    case torch::kFloat16: return studylib::DType::F16;
    case torch::kBFloat16: return studylib::DType::BF16;
    default: TORCH_CHECK(false, "sparse attention takes float32, float16 or bfloat16, not ", t.scalar_type());
  }
}

studylib::Strides3 strides_of(const torch::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

void check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  for (const auto* t : {&q, &k, &v}) {
    TORCH_CHECK(t->is_cuda(), "sparse attention tensors must be on a CUDA device");
    TORCH_CHECK(t->dim() == 4, "q, k, v must be 4-D (batch, heads, tokens, head_dim)");
    TORCH_CHECK(t->stride(3) == 1, "head_dim must be contiguous (stride 1)");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "batch and head_dim of q and k differ");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "head_dim must be 64 or 128");
  TORCH_CHECK(q.size(2) <= k.size(2), "q_len must not exceed kv_len");
}

void check_launch(cudaError_t err) { TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err)); }

torch::Tensor window_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t window, int64_t sinks,
                            int64_t splits) {
  check_qkv(q, k, v);
  TORCH_CHECK(q.size(2) == 1, "window_decode takes one query token");
  TORCH_CHECK(splits >= 1, "splits must be >= 1");
  const c10::cuda::OptionalCUDAGuard guard(q.device());
  auto out = torch::empty_like(q);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  auto f32 = q.options().dtype(torch::kFloat32);
  auto part_acc = torch::empty({splits > 1 ? B * H * splits * D : 1}, f32);
  auto part_ml = torch::empty({splits > 1 ? B * H * splits * 2 : 1}, f32);
  studylib::DecodeArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.out = out.data_ptr();
  a.part_acc = part_acc.data_ptr<float>();
  a.part_ml = part_ml.data_ptr<float>();
  a.B = B; a.H = H; a.Hkv = k.size(1); a.Tk = k.size(2); a.D = D;
  a.sq = strides_of(q); a.sk = strides_of(k); a.sv = strides_of(v); a.so = strides_of(out);
  a.window = window; a.sinks = sinks; a.splits = splits;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  check_launch(studylib::launch_window_decode(dtype_of(q), a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

torch::Tensor sparse_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor tile_idx,
                             torch::Tensor tile_cnt, c10::optional<torch::Tensor> layout, int64_t lblock,
                             int64_t window, int64_t sinks) {
  check_qkv(q, k, v);
  const int64_t n_qtiles = (q.size(2) + studylib::kPrefillBlockM - 1) / studylib::kPrefillBlockM;
  TORCH_CHECK(tile_idx.scalar_type() == torch::kInt32 && tile_idx.is_contiguous() && tile_idx.dim() == 2 &&
                  tile_idx.size(0) == n_qtiles, "tile_idx must be contiguous int32 (n_qtiles, max_tiles)");
  TORCH_CHECK(tile_cnt.scalar_type() == torch::kInt32 && tile_cnt.numel() == n_qtiles, "tile_cnt must be int32 (n_qtiles,)");
  TORCH_CHECK(tile_idx.is_cuda() && tile_cnt.is_cuda(), "tile tables must be on the GPU");
  const c10::cuda::OptionalCUDAGuard guard(q.device());
  auto out = torch::empty_like(q);
  studylib::PrefillArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.out = out.data_ptr();
  a.tile_idx = tile_idx.data_ptr<int32_t>();
  a.tile_cnt = tile_cnt.data_ptr<int32_t>();
  a.max_tiles = tile_idx.size(1);
  if (layout.has_value()) {
    TORCH_CHECK(layout->scalar_type() == torch::kInt8 && layout->is_contiguous() && layout->dim() == 2 &&
                    layout->is_cuda(), "layout must be a contiguous int8 CUDA matrix");
    TORCH_CHECK(lblock >= 1 && layout->size(0) * lblock >= k.size(2), "layout does not cover kv_len");
    a.layout = layout->data_ptr<int8_t>();
    a.n_lblocks = layout->size(1);
    a.lblock = lblock;
  } else {
    a.layout = nullptr;
    a.n_lblocks = 1;
    a.lblock = 1;
  }
  a.B = q.size(0); a.H = q.size(1); a.Hkv = k.size(1); a.Tq = q.size(2); a.Tk = k.size(2); a.D = q.size(3);
  a.sq = strides_of(q); a.sk = strides_of(k); a.sv = strides_of(v); a.so = strides_of(out);
  a.window = window; a.sinks = sinks;
  a.scale = 1.0f / std::sqrt(static_cast<float>(a.D));
  check_launch(studylib::launch_sparse_prefill(dtype_of(q), a, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "studylib sparse attention kernels (sliding-window/sinks decode, block-sparse prefill)";
  m.def("window_decode", &window_decode, "one-token decode over sinks + window (window 0 = dense)");
  m.def("sparse_prefill", &sparse_prefill, "FlashAttention-style prefill over a tile table");
  m.attr("block_m") = studylib::kPrefillBlockM;
  m.attr("block_n") = studylib::kPrefillBlockN;
}
