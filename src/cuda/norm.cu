// CUDA rms_norm (optionally fused with the residual add, Gemma-style) and
// layer_norm. One warp (small H, several rows per block) or one block per row;
// the row stays in registers as 16-byte vectors between the reduction and the
// write; the sums use a fixed warp-shuffle + shared-memory order (deterministic).
// Rows that are too long, unaligned or not a multiple of the vector width take a
// scalar path that re-reads the row (from L1/L2).
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("rms_norm", "rms_norm_residual", "layer_norm");

namespace {

// MAXT: the largest block this instantiation is launched with (128 for the
// warp-per-row form, 1024 for block-per-row), which sets the register budget.
template <class T, int VPT, int MAXT>
__global__ void __launch_bounds__(MAXT) k_norm_vec(NormArgs a) {
  constexpr int N = 16 / sizeof(T);
  using V = Vec<T, N>;
  __shared__ float sh[32];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= a.rows) return;  // only when blockDim.x == 32 (no block-wide barriers then)
  const int tpr = blockDim.x, t = threadIdx.x;
  const int nvec = int(a.H / N);
  const V* x = reinterpret_cast<const V*>(static_cast<const T*>(a.x) + row * a.x_rs);
  V xs[VPT];
  if (a.res) {
    const V* r = reinterpret_cast<const V*>(static_cast<const T*>(a.res) + row * a.res_rs);
    V* ro = reinterpret_cast<V*>(static_cast<T*>(a.res_out) + row * a.res_out_rs);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      int i = t + k * tpr;
      if (i < nvec) {
        V xv = x[i], rv = r[i];
#pragma unroll
        for (int j = 0; j < N; ++j) xs[k].v[j] = convert<T>(float(xv.v[j]) + float(rv.v[j]));
        ro[i] = xs[k];
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      int i = t + k * tpr;
      if (i < nvec) xs[k] = x[i];
    }
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
    if (t + k * tpr < nvec) {
#pragma unroll
      for (int j = 0; j < N; ++j) s += a.layer ? float(xs[k].v[j]) : float(xs[k].v[j]) * float(xs[k].v[j]);
    }
  s = row_sum(s, sh);
  const float invH = 1.f / float(a.H);
  float mean = 0.f, inv;
  if (a.layer) {
    mean = s * invH;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float d = float(xs[k].v[j]) - mean;
          q += d * d;
        }
      }
    q = row_sum(q, sh);
    inv = rsqrtf(q * invH + float(a.eps));
  } else {
    inv = rsqrtf(s * invH + float(a.eps));
  }
  const V* w = static_cast<const V*>(a.w);
  const V* b = static_cast<const V*>(a.b);
  V* out = reinterpret_cast<V*>(static_cast<T*>(a.out) + row * a.out_rs);
  const float wadd = a.gemma ? 1.f : 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    int i = t + k * tpr;
    if (i < nvec) {
      V wv = w[i], o;
      if (b) {
        V bv = b[i];
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = convert<T>((float(xs[k].v[j]) - mean) * inv * float(wv.v[j]) + float(bv.v[j]));
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = convert<T>((float(xs[k].v[j]) - mean) * inv * (float(wv.v[j]) + wadd));
      }
      out[i] = o;
    }
  }
}

// Any H and alignment: scalar accesses, the row re-read for each pass.
template <class T>
__global__ void __launch_bounds__(1024) k_norm_scalar(NormArgs a) {
  __shared__ float sh[32];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= a.rows) return;
  const int tpr = blockDim.x, t = threadIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.x_rs;
  if (a.res) {  // write the new residual, then normalize it (each thread re-reads its own writes)
    const T* r = static_cast<const T*>(a.res) + row * a.res_rs;
    T* ro = static_cast<T*>(a.res_out) + row * a.res_out_rs;
    for (int64_t i = t; i < a.H; i += tpr) ro[i] = convert<T>(float(x[i]) + float(r[i]));
    x = ro;
  }
  float s = 0.f;
  for (int64_t i = t; i < a.H; i += tpr) s += a.layer ? float(x[i]) : float(x[i]) * float(x[i]);
  s = row_sum(s, sh);
  const float invH = 1.f / float(a.H);
  float mean = 0.f, inv;
  if (a.layer) {
    mean = s * invH;
    float q = 0.f;
    for (int64_t i = t; i < a.H; i += tpr) {
      float d = float(x[i]) - mean;
      q += d * d;
    }
    q = row_sum(q, sh);
    inv = rsqrtf(q * invH + float(a.eps));
  } else {
    inv = rsqrtf(s * invH + float(a.eps));
  }
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out) + row * a.out_rs;
  const float wadd = a.gemma ? 1.f : 0.f;
  for (int64_t i = t; i < a.H; i += tpr) {
    float y = (float(x[i]) - mean) * inv * (float(w[i]) + wadd);
    if (b) y += float(b[i]);
    out[i] = convert<T>(y);
  }
}

int round32(int64_t n) { return int(std::min<int64_t>(1024, std::max<int64_t>(32, (n + 31) / 32 * 32))); }

template <class T>
void launch(const NormArgs& a, cudaStream_t st) {
  constexpr int N = 16 / sizeof(T);
  bool vec = a.H % N == 0 && a.x_rs % N == 0 && a.out_rs % N == 0 && aligned16(a.x) && aligned16(a.w) &&
             aligned16(a.out) && (!a.b || aligned16(a.b)) &&
             (!a.res || (a.res_rs % N == 0 && a.res_out_rs % N == 0 && aligned16(a.res) && aligned16(a.res_out)));
  const int64_t nvec = a.H / N;
  int tpr = 0, vpt = 0;
  if (vec) {
    if (nvec <= 32 * 8) {
      tpr = 32;
      vpt = nvec <= 32 ? 1 : nvec <= 64 ? 2 : nvec <= 128 ? 4 : 8;
    } else if (nvec <= 4 * 1024) {
      vpt = 4;
      tpr = round32((nvec + 3) / 4);
    }
  }
  if (!vpt) tpr = a.H <= 1024 ? 32 : 256;
  const int rpb = tpr == 32 ? 4 : 1;  // rows per block
  dim3 block{unsigned(tpr), unsigned(rpb), 1u};
  int64_t blocks = (a.rows + rpb - 1) / rpb;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("x: too many rows for one launch");
  dim3 grid{unsigned(blocks), 1u, 1u};
  switch (vpt) {
    case 1: k_norm_vec<T, 1, 128><<<grid, block, 0, st>>>(a); break;
    case 2: k_norm_vec<T, 2, 128><<<grid, block, 0, st>>>(a); break;
    case 4:
      if (tpr == 32) k_norm_vec<T, 4, 128><<<grid, block, 0, st>>>(a);
      else k_norm_vec<T, 4, 1024><<<grid, block, 0, st>>>(a);
      break;
    case 8: k_norm_vec<T, 8, 128><<<grid, block, 0, st>>>(a); break;
    default: k_norm_scalar<T><<<grid, block, 0, st>>>(a); break;
  }
  GK_LAUNCH_CHECK(a.layer ? "layer_norm" : "rms_norm");
}

}  // namespace

void norm(const NormArgs& a, void* stream) {
  dispatch_float(a.dtype, [&](auto t) { launch<decltype(t)>(a, static_cast<cudaStream_t>(stream)); });
}

}  // namespace gk::cuda
