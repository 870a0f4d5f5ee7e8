// Front end of embedding: rows of table [V, H] gathered for integer ids of any
// shape. Host-visible ids are range-checked (IndexError naming the id); ids on
// the CPU with a CUDA table are copied to the table's device.
#include "gpukit/llm.h"
#include "ops/common.h"
#include "ops/embedding_args.h"

namespace gk {

Array embedding(const Array& ids_in, const Array& table, const Stream* sp) {
  detail::require_defined(ids_in, "ids");
  detail::require_defined(table, "table");
  if (ids_in.dtype() != DType::i32 && ids_in.dtype() != DType::i64)
    throw TypeError(cat("ids: embedding needs int32 or int64 ids, got ", dtype_name(ids_in.dtype())));
  if (table.ndim() != 2) throw ValueError(cat("table: expected a 2-d [vocab, hidden] array, got shape ",
                                              shape_str(table.shape())));
  if (table.stride(1) != 1 && table.shape(1) > 1)
    throw ValueError("table: the hidden dimension must be dense (stride 1)");
  Device d = table.device();
  Stream s = resolve_stream(sp, d);
  const int64_t V = table.shape(0), H = table.shape(1);
  Array ids = ids_in.device().is_cpu() ? ids_in.contiguous() : ids_in.contiguous(&s);
  if (ids.device().is_cpu()) {
    const int64_t n = ids.numel();
    for (int64_t t = 0; t < n; ++t) {
      int64_t id = ids.dtype() == DType::i64 ? ids.data_as<int64_t>()[t] : ids.data_as<int32_t>()[t];
      if (id < 0 || id >= V) throw IndexError(cat("ids: token id ", id, " is outside the table's [0, ", V, ")"));
    }
    if (!d.is_cpu()) ids = ids.to(d, &s);
  } else if (ids.device() != d) {
    throw ValueError(cat("ids: on ", ids.device().str(), " but table is on ", d.str()));
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(H);
  Array out = Array::empty(out_shape, table.dtype(), d, &s);
  EmbeddingArgs a;
  a.ids = ids.data();
  a.ids64 = ids.dtype() == DType::i64;
  a.table = table.data();
  a.vocab = V;
  a.hidden = H;
  a.table_rs = table.stride(0);
  a.n = ids.numel();
  a.out = out.data();
  a.elem_bytes = int(table.itemsize());
  if (a.n == 0 || H == 0) return out;
  if (d.is_cpu()) {
    cpu::embedding(a);
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(ids, s);
    detail::mark_used(table, s);
    cuda::embedding(a, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return out;
}

}  // namespace gk
