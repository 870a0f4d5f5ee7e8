// CPU reference of the mixture-of-experts kernels (see include/gpukit/moe.h and
// src/ops/moe_args.h). The CUDA kernels (src/cuda/moe.cu) follow the same orders:
// the grouped GEMM and the un-permute give the same bits on both backends; the
// gating gives the same experts (chosen by logit) and weights within a few ulps
// (exp differs between libm and CUDA by at most an ulp or two).
#include <algorithm>
#include <cmath>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/numeric.h"
#include "ops/moe_args.h"
#include "ops/registry.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("moe_topk_gating", "moe_permute", "moe_unpermute", "moe_grouped_gemm");

namespace {

template <class T>
void gating_t(const MoeGatingArgs& p) {
  const T* lg = static_cast<const T*>(p.logits);
  std::vector<float> prob(size_t(p.e));
  std::vector<char> taken(size_t(p.e));
  for (int64_t t = 0; t < p.t; ++t) {
    const T* row = lg + t * p.e;
    float mx = -INFINITY;
    for (int64_t i = 0; i < p.e; ++i) mx = std::fmax(mx, float(row[i]));
    float sum = 0.0f;
    for (int64_t i = 0; i < p.e; ++i) {
      prob[size_t(i)] = std::exp(float(row[i]) - mx);
      sum += prob[size_t(i)];
    }
    std::fill(taken.begin(), taken.end(), 0);
    float chosen = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      int64_t best = -1;
      float bv = 0.0f;
      for (int64_t i = 0; i < p.e; ++i) {
        if (taken[size_t(i)]) continue;
        float v = float(row[i]);
        // strictly greater: ties keep the lower expert; NaN logits are never preferred
        if (best < 0 || v > bv || (std::isnan(bv) && !std::isnan(v))) {
          best = i;
          bv = v;
        }
      }
      taken[size_t(best)] = 1;
      p.ids[t * p.k + j] = int32_t(best);
      float w = prob[size_t(best)] / sum;
      p.weights[t * p.k + j] = w;
      chosen += w;
    }
    if (p.renormalize)
      for (int64_t j = 0; j < p.k; ++j) p.weights[t * p.k + j] = p.weights[t * p.k + j] / chosen;
  }
}

template <class T>
void permute_t(const MoePermuteArgs& p) {
  const int64_t S = p.t * p.k;
  std::vector<int64_t> count(size_t(p.e) + 1, 0);
  for (int64_t s = 0; s < S; ++s) count[size_t(p.ids[s])]++;
  p.offsets[0] = 0;
  for (int64_t e = 0; e < p.e; ++e) p.offsets[e + 1] = int32_t(p.offsets[e] + count[size_t(e)]);
  std::vector<int64_t> next(size_t(p.e));
  for (int64_t e = 0; e < p.e; ++e) next[size_t(e)] = p.offsets[e];
  const T* x = static_cast<const T*>(p.x);
  T* xs = static_cast<T*>(p.x_sorted);
  for (int64_t s = 0; s < S; ++s) {  // slots in increasing (token, choice) order: stable
    const int64_t pos = next[size_t(p.ids[s])]++;
    p.slot_pos[s] = int32_t(pos);
    p.sorted_token[pos] = int32_t(s / p.k);
    std::copy(x + (s / p.k) * p.x_rs, x + (s / p.k) * p.x_rs + p.h, xs + pos * p.h);
  }
}

template <class I, class O>
void unpermute_t(const MoeUnpermuteArgs& p) {
  const I* y = static_cast<const I*>(p.y_sorted);
  O* out = static_cast<O*>(p.out);
  for (int64_t t = 0; t < p.t; ++t)
    for (int64_t c = 0; c < p.h; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) {
        const float w = p.weights[t * p.k + j];
        const float v = float(y[int64_t(p.slot_pos[t * p.k + j]) * p.h + c]);
        const float prod = w * v;  // rounded, then added: the CUDA kernel uses _rn operations
        acc = acc + prod;
      }
      out[t * p.h + c] = convert<O>(acc);
    }
}

template <class T, class O>
void gemm_t(const MoeGemmArgs& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  O* y = static_cast<O*>(p.y);
  std::fill(y, y + p.r * p.n, convert<O>(0.0f));
  std::vector<float> xr(size_t(p.kdim));
  for (int64_t e = 0; e < p.e; ++e) {
    const T* we = w + e * p.n * p.kdim;
    for (int64_t r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
      for (int64_t l = 0; l < p.kdim; ++l) xr[size_t(l)] = float(x[r * p.kdim + l]);
      for (int64_t j = 0; j < p.n; ++j) {
        const T* wr = we + j * p.kdim;
        float acc = 0.0f;
        if constexpr (std::is_same_v<T, float>) {
          for (int64_t l = 0; l < p.kdim; ++l) acc = std::fma(xr[size_t(l)], wr[l], acc);
        } else {  // bf16/f16 products are exact in fp32: mul + add == the GPU's fma
          for (int64_t l = 0; l < p.kdim; ++l) acc += xr[size_t(l)] * float(wr[l]);
        }
        y[r * p.n + j] = convert<O>(acc);
      }
    }
  }
}

template <class T>
void gemm_out(const MoeGemmArgs& p) {
  switch (p.out_dtype) {
    case DType::f32: return gemm_t<T, float>(p);
    case DType::f16: return gemm_t<T, f16>(p);
    case DType::bf16: return gemm_t<T, bf16>(p);
    default: throw ValueError(cat("moe_grouped_gemm: unsupported output dtype ", dtype_name(p.out_dtype)));
  }
}

template <class I>
void unpermute_out(const MoeUnpermuteArgs& p) {
  switch (p.out_dtype) {
    case DType::f32: return unpermute_t<I, float>(p);
    case DType::f16: return unpermute_t<I, f16>(p);
    case DType::bf16: return unpermute_t<I, bf16>(p);
    default: throw ValueError(cat("moe_unpermute: unsupported output dtype ", dtype_name(p.out_dtype)));
  }
}

}  // namespace

void moe_topk_gating(const MoeGatingArgs& a) {
  switch (a.dtype) {
    case DType::f32: return gating_t<float>(a);
    case DType::f16: return gating_t<f16>(a);
    case DType::bf16: return gating_t<bf16>(a);
    default: throw TypeError(cat("moe_topk_gating: unsupported dtype ", dtype_name(a.dtype)));
  }
}

void moe_permute(const MoePermuteArgs& a) {
  switch (itemsize(a.dtype)) {
    case 4: return permute_t<uint32_t>(a);
    case 2: return permute_t<uint16_t>(a);
    case 1: return permute_t<uint8_t>(a);
    case 8: return permute_t<uint64_t>(a);
    default: throw TypeError(cat("moe_permute: unsupported dtype ", dtype_name(a.dtype)));
  }
}

void moe_unpermute(const MoeUnpermuteArgs& a) {
  switch (a.in_dtype) {
    case DType::f32: return unpermute_out<float>(a);
    case DType::f16: return unpermute_out<f16>(a);
    case DType::bf16: return unpermute_out<bf16>(a);
    default: throw TypeError(cat("moe_unpermute: unsupported dtype ", dtype_name(a.in_dtype)));
  }
}

void moe_grouped_gemm(const MoeGemmArgs& a) {
  switch (a.dtype) {
    case DType::f32: return gemm_out<float>(a);
    case DType::f16: return gemm_out<f16>(a);
    case DType::bf16: return gemm_out<bf16>(a);
    default: throw TypeError(cat("moe_grouped_gemm: unsupported dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cpu
