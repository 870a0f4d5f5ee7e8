// CPU reference of kv_append: token by token, with the shared destination rule.
#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("kv_append");

namespace {
template <class T, class C>
void run(const KvAppendArgs& a) {
  for (int64_t t = 0; t < a.T; ++t) {
    int64_t blk, off;
    if (!kv_dest(a, t, blk, off)) continue;
    for (int h = 0; h < a.hkv; ++h) {
      int64_t dst = ((blk * a.bs + off) * a.hkv + h) * a.D;
      const T* k = static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs;
      const T* v = static_cast<const T*>(a.v) + t * a.v_ts + h * a.v_hs;
      C* kc = static_cast<C*>(a.kc) + dst;
      C* vc = static_cast<C*>(a.vc) + dst;
      for (int i = 0; i < a.D; ++i) {
        if constexpr (std::is_same_v<C, f8e4m3>) {
          kc[i] = f8e4m3(convert<float>(k[i]) / a.k_scale[h]);
          vc[i] = f8e4m3(convert<float>(v[i]) / a.v_scale[h]);
        } else {
          kc[i] = k[i];
          vc[i] = v[i];
        }
      }
    }
  }
}
}  // namespace

void kv_append(const KvAppendArgs& a) {
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    if (a.cache_dtype == DType::f8e4m3) run<T, f8e4m3>(a);
    else run<T, T>(a);
  });
}

}  // namespace gk::cpu
