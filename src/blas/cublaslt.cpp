// cuBLASLt loader and the one GEMM call gpukit makes through it (see cublaslt.h
// for the search order and how results stay reproducible). The toolkit header
// is included for types and enum values only; every function is found with dlsym.
#include "blas/cublaslt.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/dynlib.h"
#include "gpukit/errors.h"

#if GPUKIT_WITH_CUDA
#include <cublasLt.h>
#include <dlfcn.h>

#include <map>
#include <memory>

#include "core/cuda_util.h"
#include "gpukit/allocator.h"
#include "gpukit/array.h"
#include "gpukit/stream.h"
#endif

namespace gk::blas {

namespace {
std::atomic<uint64_t> g_lt_calls{0}, g_fallbacks{0}, g_plans{0}, g_no_algo{0};
using dynlib::env;
[[maybe_unused]] bool env_on(const char* name) {
  std::string v = env(name);
  return !v.empty() && v != "0";
}
}  // namespace

Stats stats() { return {g_lt_calls.load(), g_fallbacks.load(), g_plans.load(), g_no_algo.load()}; }
void count_fallback() { g_fallbacks++; }

bool supports(DType ab, DType d) {
  switch (ab) {
    case DType::f32: return d == DType::f32;
    case DType::f64: return d == DType::f64;
    case DType::f16: case DType::bf16: return d == ab || d == DType::f32;
    case DType::i8: return d == DType::i32;
    case DType::f8e4m3: return d == DType::bf16 || d == DType::f16 || d == DType::f32;
    default: return false;
  }
}

#if !GPUKIT_WITH_CUDA

bool available() { return false; }
std::string unavailable_reason() { return "gpukit was built without CUDA"; }
std::string library_path() { return {}; }
int version() { return 0; }
void add_search_paths(const std::vector<std::string>&) {}
bool matmul(const LtGemm&, int, void*) { return false; }

#else

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Api {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtGetVersion) GetVersion;
  decltype(&::cublasLtMatmulDescCreate) DescCreate;
  decltype(&::cublasLtMatmulDescDestroy) DescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) DescSet;
  decltype(&::cublasLtMatrixLayoutCreate) LayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) LayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) LayoutSet;
  decltype(&::cublasLtMatmulPreferenceCreate) PrefCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) PrefDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) PrefSet;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) Heuristic;
  decltype(&::cublasLtMatmul) Matmul;
};

struct Plan {
  bool ok = false;
  cublasLtMatmulAlgo_t algo{};
  size_t ws = 0;
};

struct Loader {
  std::mutex mu;
  bool tried = false;
  void* handle = nullptr;
  Api api{};
  std::string path, reason;
  int version = 0;
  std::vector<std::string> extra;
  // per device: handle, private allocation stream; per (device, stream): workspace
  std::map<int, cublasLtHandle_t> handles;
  std::map<int, Stream> alloc_streams;
  std::map<std::pair<int, void*>, std::shared_ptr<Storage>> workspaces;
  std::map<std::vector<int64_t>, Plan> plans;
};
Loader& L() {
  static auto* l = new Loader();  // never destroyed: work may still be queued at exit
  return *l;
}

std::vector<std::string> candidates(const Loader& l) {
  return dynlib::candidates("GPUKIT_CUBLASLT_PATH", {"libcublasLt.so.13", "libcublasLt.so"}, l.extra);
}

using dynlib::sym;

bool try_open(Loader& l, const std::string& cand) {
  void* h = dynlib::open_lib(cand, l.reason);
  if (!h) return false;
  Api a{};
  std::string missing;
  bool ok = sym(h, "cublasLtCreate", a.Create, missing) & sym(h, "cublasLtGetVersion", a.GetVersion, missing) &
            sym(h, "cublasLtMatmulDescCreate", a.DescCreate, missing) &
            sym(h, "cublasLtMatmulDescDestroy", a.DescDestroy, missing) &
            sym(h, "cublasLtMatmulDescSetAttribute", a.DescSet, missing) &
            sym(h, "cublasLtMatrixLayoutCreate", a.LayoutCreate, missing) &
            sym(h, "cublasLtMatrixLayoutDestroy", a.LayoutDestroy, missing) &
            sym(h, "cublasLtMatrixLayoutSetAttribute", a.LayoutSet, missing) &
            sym(h, "cublasLtMatmulPreferenceCreate", a.PrefCreate, missing) &
            sym(h, "cublasLtMatmulPreferenceDestroy", a.PrefDestroy, missing) &
            sym(h, "cublasLtMatmulPreferenceSetAttribute", a.PrefSet, missing) &
            sym(h, "cublasLtMatmulAlgoGetHeuristic", a.Heuristic, missing) &
            sym(h, "cublasLtMatmul", a.Matmul, missing);
  if (!ok) {
    l.reason += "\n  " + cand + ": not cuBLASLt (missing " + missing + ")";
    dlclose(h);
    return false;
  }
  size_t v = a.GetVersion();
  if (v < 120000) {  // the enum values of the header this file was compiled with need 12.x or newer
    l.reason += "\n  " + cand + ": cuBLASLt version " + std::to_string(v) + " is too old (12.0 or newer needed)";
    dlclose(h);
    return false;
  }
  l.handle = h;
  l.api = a;
  l.version = int(v);
  l.path = dynlib::loaded_path(h, cand);
  l.reason.clear();
  return true;
}

// Loads on first use; call with l.mu held.
bool load_locked(Loader& l) {
  if (l.tried) return l.handle != nullptr;
  l.tried = true;
  if (env_on("GPUKIT_DISABLE_CUBLASLT")) {
    l.reason = "cuBLASLt is disabled by GPUKIT_DISABLE_CUBLASLT";
    return false;
  }
  for (const auto& c : candidates(l))
    if (try_open(l, c)) return true;
  std::string tried = l.reason;
  l.reason = "cuBLASLt (libcublasLt.so.13) was not found. Install the CUDA toolkit or `pip install "
             "nvidia-cublas`, or set GPUKIT_CUBLASLT_PATH to the library.";
  if (!tried.empty()) l.reason += " Tried:" + tried;
  return false;
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CudaError(cat("cuBLASLt: ", what, " failed with status ", int(st)), int(st), false);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f64: return CUDA_R_64F;
    case DType::i8: return CUDA_R_8I;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::i32: return CUDA_R_32I;
    default: return CUDA_R_32F;
  }
}

// A row-major operand (rows x cols, strides rs/cs) as a column-major cuBLASLt
// matrix: either its transpose stored with ld = rs (op N on the transpose), or
// itself stored with ld = cs (op T). Sizes of 1 make the matching stride free.
struct Fit {
  bool ok = false;
  bool trans = false;    // true: the column-major matrix is the operand itself (needs op T)
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};
Fit fit(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  Fit f;
  bool cs_unit = cs == 1 || cols == 1;
  bool rs_unit = rs == 1 || rows == 1;
  if (cs_unit && (rows == 1 || rs >= cols)) {  // rows contiguous: column-major cols x rows, ld rs
    f = {true, false, uint64_t(cols), uint64_t(rows), rows == 1 ? std::max<int64_t>(cols, 1) : rs};
  } else if (rs_unit && (cols == 1 || cs >= rows)) {  // columns contiguous: column-major rows x cols, ld cs
    f = {true, true, uint64_t(rows), uint64_t(cols), cols == 1 ? std::max<int64_t>(rows, 1) : cs};
  }
  if (f.ok && f.ld < 1) f.ok = false;
  return f;
}

uint32_t align_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

// cuBLASLt's FP8 kernels need every dimension and leading dimension to be a multiple
// of 16 and 16-byte aligned pointers (the "Tensor Core usage" requirements); outside
// them it may reject the problem late or compute garbage, so gpukit's own path serves.
// Block scales (1x128 / 128x128) also need K to be a multiple of 128.
bool fp8_shape_ok(const LtGemm& g, const Fit& fa, const Fit& fb) {
  if (g.m % 16 || g.n % 16 || g.k % 16 || fa.ld % 16 || fb.ld % 16 || g.ldd % 16) return false;
  if (g.batch != 1) return false;
  for (const void* p : {g.a, g.b, static_cast<const void*>(g.d)})
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  if (g.a_scale_mode != ScaleMode::scalar || g.b_scale_mode != ScaleMode::scalar) {
    if (g.k % 128) return false;
    for (const void* p : {static_cast<const void*>(g.a_scale), static_cast<const void*>(g.b_scale)})
      if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  }
  return true;
}

struct Descs {
  const Api* api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) api->PrefDestroy(pref);
    if (lc) api->LayoutDestroy(lc);
    if (lb) api->LayoutDestroy(lb);
    if (la) api->LayoutDestroy(la);
    if (op) api->DescDestroy(op);
  }
};

int32_t lt_scale_mode(ScaleMode m) {
  switch (m) {
    case ScaleMode::vec128: return int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
    case ScaleMode::blk128x128: return int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
    default: return int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
  }
}

void set_batch(const Api& api, cublasLtMatrixLayout_t l, int32_t count, int64_t stride) {
  check(api.LayoutSet(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "layout batch count");
  check(api.LayoutSet(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), "layout batch stride");
}

}  // namespace

bool available() {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  return load_locked(l);
}
std::string unavailable_reason() {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  load_locked(l);
  return l.reason;
}
std::string library_path() {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  load_locked(l);
  return l.path;
}
int version() {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  load_locked(l);
  return l.version;
}
void add_search_paths(const std::vector<std::string>& paths) {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  for (const auto& p : paths) l.extra.push_back(p);
}

bool matmul(const LtGemm& g, int device, void* stream) {
  if (!supports(g.ab_dtype, g.d_dtype) || (g.tf32 && g.ab_dtype != DType::f32)) return false;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0 || g.batch > INT32_MAX) return false;
  if (g.ldd < g.n || (g.c && g.c == g.d)) return false;
  // Column-major problem: D^T (n x m) = B^T (n x k) * A^T (k x m); cuBLASLt's A is our B.
  Fit fa = fit(g.k, g.n, g.b_rs, g.b_cs);  // our B (k x n)
  Fit fb = fit(g.m, g.k, g.a_rs, g.a_cs);  // our A (m x k)
  if (!fa.ok || !fb.ok) return false;
  if (g.batch > 1 && (g.a_bs < 0 || g.b_bs < 0 || g.d_bs < g.m * g.ldd)) return false;
  const bool i8 = g.ab_dtype == DType::i8;
  const bool fp8 = g.ab_dtype == DType::f8e4m3;
  if (fp8 && (!fa.trans || fb.trans || g.epi != Epilogue::none || g.c)) return false;  // TN only, like int8
  if (fp8 && !fp8_shape_ok(g, fa, fb)) return false;
  // int8 (IMMA) in column-major order takes only the "TN" form: cuBLASLt's A transposed
  // (our B = w^T with w's rows contiguous), its B not (our A with rows contiguous).
  if (i8 && (!fa.trans || fb.trans || g.epi != Epilogue::none || g.c)) return false;

  Loader& l = L();
  cublasLtHandle_t h = nullptr;
  std::shared_ptr<Storage> ws;
  {
    std::lock_guard<std::mutex> lk(l.mu);
    if (!load_locked(l)) return false;
    detail::set_device(device);
    auto hit = l.handles.find(device);
    if (hit == l.handles.end()) {
      check(l.api.Create(&h), "cublasLtCreate");
      l.handles[device] = h;
    } else {
      h = hit->second;
    }
    auto key = std::make_pair(device, stream);
    auto wit = l.workspaces.find(key);
    if (wit == l.workspaces.end()) {
      // Allocated on a private stream of gpukit's allocator so that it never belongs to
      // a graph being captured on `stream`; kept for the life of the process.
      auto sit = l.alloc_streams.find(device);
      if (sit == l.alloc_streams.end()) sit = l.alloc_streams.emplace(device, Stream::create(Device::cuda(device))).first;
      ws = allocate(Device::cuda(device), kWorkspaceBytes, sit->second);
      l.workspaces[key] = ws;
    } else {
      ws = wit->second;
    }
  }
  const Api& api = l.api;
  const bool f64 = g.ab_dtype == DType::f64;
  cublasComputeType_t compute =
      i8 ? CUBLAS_COMPUTE_32I
         : (f64 ? CUBLAS_COMPUTE_64F : (g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F));
  cudaDataType_t scale = i8 ? CUDA_R_32I : (f64 ? CUDA_R_64F : CUDA_R_32F);
  cudaDataType_t tab = cuda_type(g.ab_dtype), td = cuda_type(g.d_dtype);
  const void* lt_a = g.b;
  const void* lt_b = g.a;
  const void* cptr = g.c ? g.c : g.d;
  uint32_t al_a = align_of(lt_a), al_b = align_of(lt_b), al_c = align_of(cptr), al_d = align_of(g.d);
  const bool splitk = !env_on("GPUKIT_CUBLASLT_NO_SPLITK");
  // Split-K partial sums stored in the output type would round every partial to
  // bf16/f16 before they are added (and before the bias): more than the one rounding
  // gpukit promises. That scheme is allowed only when the output type is the compute
  // type (float32, float64, int32).
  const bool d_is_compute = g.d_dtype == DType::f32 || g.d_dtype == DType::f64 || g.d_dtype == DType::i32;
  uint32_t reduction = uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE);
  if (splitk) {
    reduction |= uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    if (d_is_compute) reduction |= uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);
  }

  Descs ds{&api};
  check(api.DescCreate(&ds.op, compute, scale), "matmul descriptor");
  cublasOperation_t opa = fa.trans ? CUBLAS_OP_T : CUBLAS_OP_N, opb = fb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)), "transa");
  check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)), "transb");
  if (fp8 && g.a_scale && g.b_scale) {  // cuBLASLt's A is our B: its scale is ours of B
    const void* sa = g.b_scale;
    const void* sb = g.a_scale;
    check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "A scale pointer");
    check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "B scale pointer");
    if (g.a_scale_mode != ScaleMode::scalar || g.b_scale_mode != ScaleMode::scalar) {
      int32_t ma = lt_scale_mode(g.b_scale_mode), mb = lt_scale_mode(g.a_scale_mode);
      check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)), "A scale mode");
      check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)), "B scale mode");
    }
  }
  if (g.epi == Epilogue::bias) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)), "epilogue");
    const void* bp = g.bias;
    check(api.DescSet(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)), "bias pointer");
  }
  check(api.LayoutCreate(&ds.la, tab, fa.rows, fa.cols, fa.ld), "layout A");
  check(api.LayoutCreate(&ds.lb, tab, fb.rows, fb.cols, fb.ld), "layout B");
  check(api.LayoutCreate(&ds.lc, td, uint64_t(g.n), uint64_t(g.m), g.ldd), "layout D");
  if (g.batch > 1) {
    set_batch(api, ds.la, int32_t(g.batch), g.b_bs);
    set_batch(api, ds.lb, int32_t(g.batch), g.a_bs);
    set_batch(api, ds.lc, int32_t(g.batch), g.d_bs);
  }

  std::vector<int64_t> key = {device, g.m, g.n, g.k, g.batch, int64_t(g.ab_dtype), int64_t(g.d_dtype), g.tf32,
                              int64_t(g.epi), g.c != nullptr, fa.trans, fb.trans, fa.ld, fb.ld, g.ldd,
                              g.batch > 1 ? g.a_bs : 0, g.batch > 1 ? g.b_bs : 0, g.batch > 1 ? g.d_bs : 0,
                              al_a, al_b, al_c, al_d, splitk, g.a_scale != nullptr,
                              int64_t(g.a_scale_mode), int64_t(g.b_scale_mode)};
  Plan plan;
  {
    std::lock_guard<std::mutex> lk(l.mu);
    auto it = l.plans.find(key);
    if (it != l.plans.end()) plan = it->second;
  }
  if (!plan.ok) {
    bool known_bad = false;
    {
      std::lock_guard<std::mutex> lk(l.mu);
      known_bad = l.plans.count(key) > 0;
    }
    if (known_bad) return false;
    check(api.PrefCreate(&ds.pref), "preference");
    uint64_t wsb = kWorkspaceBytes;
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)), "workspace limit");
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)),
          "reduction scheme mask");
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)), "alignment A");
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)), "alignment B");
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)), "alignment C");
    check(api.PrefSet(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)), "alignment D");
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    cublasStatus_t st = api.Heuristic(h, ds.op, ds.la, ds.lb, ds.lc, ds.lc, ds.pref, 1, &res, &found);
    Plan p;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS &&
        res.workspaceSize <= kWorkspaceBytes) {
      p.ok = true;
      p.algo = res.algo;
      p.ws = res.workspaceSize;
      g_plans++;
    } else {
      g_no_algo++;
    }
    std::lock_guard<std::mutex> lk(l.mu);
    auto ins = l.plans.emplace(key, p);  // a racing thread's identical choice wins; same algorithm either way
    plan = ins.first->second;
    if (!plan.ok) return false;
  }
  float alpha_f = 1.0f, beta_f = g.c ? 1.0f : 0.0f;
  double alpha_d = 1.0, beta_d = g.c ? 1.0 : 0.0;
  int32_t alpha_i = 1, beta_i = 0;
  const void* alpha = i8 ? static_cast<const void*>(&alpha_i)
                         : (f64 ? static_cast<const void*>(&alpha_d) : static_cast<const void*>(&alpha_f));
  const void* beta = i8 ? static_cast<const void*>(&beta_i)
                        : (f64 ? static_cast<const void*>(&beta_d) : static_cast<const void*>(&beta_f));
  cublasStatus_t st = api.Matmul(h, ds.op, alpha, lt_a, ds.la, lt_b, ds.lb, beta, cptr, ds.lc, g.d, ds.lc,
                                 &plan.algo, plan.ws ? ws->ptr : nullptr, plan.ws, static_cast<cudaStream_t>(stream));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    // Rejected before any launch: remember the key as unusable and let the caller's kernel run.
    std::lock_guard<std::mutex> lk(l.mu);
    l.plans[key] = Plan{};
    g_no_algo++;
    return false;
  }
  check(st, "cublasLtMatmul");
  GK_LAUNCH_CHECK("cublasLtMatmul");
  g_lt_calls++;
  return true;
}

#endif  // GPUKIT_WITH_CUDA

}  // namespace gk::blas
