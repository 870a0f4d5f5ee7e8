// safetensors reader and writer.
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data
// section. The header maps tensor names to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the data section) plus an optional
// "__metadata__" object of string -> string. The rules enforced here: N <= 1e8
// and inside the file; strict JSON; known dtypes; element count * item size
// (overflow-checked) == end - begin; the tensors, sorted by offset, tile the data
// section exactly (no gap, no overlap, no trailing bytes).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "io/json.h"
#include "io/reader.h"

namespace gk::io {
using detail::JsonReader;
using detail::quote;

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F64", DType::f64}, {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
    {"F8_E4M3", DType::f8e4m3}, {"F8_E5M2", DType::f8e5m2}, {"I64", DType::i64}, {"I32", DType::i32},
    {"I16", DType::i16}, {"I8", DType::i8}, {"U8", DType::u8}, {"BOOL", DType::b8},
};

[[noreturn]] void bad(const std::string& what, const std::string& msg) { throw FormatError(cat(what, ": ", msg)); }

void parse_tensor_entry(JsonReader& j, TensorInfo& t, const std::string& what) {
  std::string where = cat("tensor ", quote(t.name));
  j.begin_object(where.c_str());
  bool first = true, have_dtype = false, have_shape = false, have_offsets = false;
  std::string key;
  while (j.next_key(key, first, where.c_str())) {
    if (key == "dtype") {
      if (have_dtype) j.fail(cat(where, ": duplicate key 'dtype'"));
      have_dtype = true;
      std::string d = j.string("dtype");
      auto it = std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](auto& e) { return d == e.name; });
      if (it == std::end(kDTypes)) bad(what, cat(where, ": unsupported dtype ", quote(d)));
      t.dtype = it->dtype;
    } else if (key == "shape") {
      if (have_shape) j.fail(cat(where, ": duplicate key 'shape'"));
      have_shape = true;
      j.begin_array("shape");
      bool f = true;
      while (j.next_elem(f, "shape")) {
        uint64_t d = j.uint("shape");
        if (d > uint64_t(INT64_MAX)) bad(what, cat(where, ": dimension ", d, " does not fit in int64"));
        t.shape.push_back(int64_t(d));
      }
    } else if (key == "data_offsets") {
      if (have_offsets) j.fail(cat(where, ": duplicate key 'data_offsets'"));
      have_offsets = true;
      j.begin_array("data_offsets");
      bool f = true;
      int n = 0;
      while (j.next_elem(f, "data_offsets")) {
        if (n >= 2) bad(what, cat(where, ": data_offsets must have exactly 2 entries"));
        (n == 0 ? t.begin : t.end) = j.uint("data_offsets");
        ++n;
      }
      if (n != 2) bad(what, cat(where, ": data_offsets must have exactly 2 entries"));
    } else {
      j.skip_value(1);  // unknown fields are tolerated (and validated as JSON)
    }
  }
  if (!have_dtype) bad(what, cat(where, ": missing 'dtype'"));
  if (!have_shape) bad(what, cat(where, ": missing 'shape'"));
  if (!have_offsets) bad(what, cat(where, ": missing 'data_offsets'"));
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (auto& e : kDTypes)
    if (e.dtype == t) return e.name;
  return "?";
}

SafeTensors::SafeTensors(const std::string& path) : file_(MappedFile::open(path)) { parse(); }
SafeTensors::SafeTensors(std::shared_ptr<MappedFile> file) : file_(std::move(file)) { parse(); }

void SafeTensors::parse() {
  const std::string what = cat("safetensors file '", file_->path(), "'");
  detail::ByteReader r(file_->data(), file_->size(), what);
  uint64_t n = r.read<uint64_t>("header length");
  if (n > kMaxHeader) bad(what, cat("header length ", n, " exceeds the limit of ", kMaxHeader, " bytes"));
  if (n > r.remaining())
    bad(what, cat("header length ", n, " exceeds the file (", r.remaining(), " bytes follow the length field)"));
  if (n < 2) bad(what, cat("header length ", n, " is too small for a JSON object"));
  std::string_view hdr = r.bytes(n, "header");
  data_start_ = 8 + n;
  const uint64_t data_size = file_->size() - data_start_;

  JsonReader j(hdr, what);
  if (j.peek() != '{') bad(what, "header does not start with a JSON object");
  j.begin_object("header");
  bool first = true, have_meta = false;
  std::string key;
  while (j.next_key(key, first, "header")) {
    if (key == "__metadata__") {
      if (have_meta) bad(what, "duplicate key '__metadata__'");
      have_meta = true;
      j.begin_object("__metadata__");
      bool f = true;
      std::string k;
      while (j.next_key(k, f, "__metadata__")) {
        if (j.peek() != '"') bad(what, cat("__metadata__ value for ", quote(k), " is not a string"));
        std::string v = j.string("__metadata__ value");
        if (!metadata_.emplace(k, std::move(v)).second) bad(what, cat("duplicate __metadata__ key ", quote(k)));
      }
      continue;
    }
    if (index_.count(key)) bad(what, cat("duplicate tensor name ", quote(key)));
    TensorInfo t;
    t.name = key;
    parse_tensor_entry(j, t, what);
    index_.emplace(key, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  j.finish();

  for (auto& t : tensors_) {
    uint64_t numel = 1, nbytes = 0;
    for (int64_t d : t.shape)
      if (detail::mul_ovf(numel, uint64_t(d), &numel) || numel > uint64_t(INT64_MAX))
        bad(what, cat("tensor ", quote(t.name), ": shape ", shape_str(t.shape), " has too many elements"));
    if (detail::mul_ovf(numel, itemsize(t.dtype), &nbytes) || nbytes > uint64_t(INT64_MAX))
      bad(what, cat("tensor ", quote(t.name), ": shape ", shape_str(t.shape), " needs more bytes than fit in 64 bits"));
    if (t.end < t.begin)
      bad(what, cat("tensor ", quote(t.name), ": data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
    if (t.end > data_size)
      bad(what, cat("tensor ", quote(t.name), ": data_offsets [", t.begin, ", ", t.end,
                    "] extend past the end of the data section (", data_size, " bytes)"));
    if (t.end - t.begin != nbytes)
      bad(what, cat("tensor ", quote(t.name), ": ", t.end - t.begin, " bytes in data_offsets but shape ",
                    shape_str(t.shape), " of ", safetensors_dtype_name(t.dtype), " needs ", nbytes));
  }
  // Sorted by offsets, the tensors must tile [0, data_size) exactly.
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(tensors_[a].begin, tensors_[a].end) < std::pair(tensors_[b].begin, tensors_[b].end);
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (size_t k : order) {
    const TensorInfo& t = tensors_[k];
    if (t.begin < expected)
      bad(what, cat("tensor ", quote(t.name), " overlaps tensor ", quote(prev->name), " (data_offsets [", t.begin, ", ",
                    t.end, "] begin before ", expected, ")"));
    if (t.begin > expected)
      bad(what, cat("gap in the data section: tensor ", quote(t.name), " begins at ", t.begin, " but the data before it ends at ",
                    expected));
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size)
    bad(what, cat(data_size - expected, " trailing bytes after the last tensor (data section is ", data_size,
                  " bytes, tensors cover ", expected, ")"));
  // Keep tensors in offset order.
  std::vector<TensorInfo> sorted;
  sorted.reserve(tensors_.size());
  for (size_t k : order) sorted.push_back(std::move(tensors_[k]));
  tensors_ = std::move(sorted);
  index_.clear();
  for (size_t k = 0; k < tensors_.size(); ++k) index_[tensors_[k].name] = k;
}

const TensorInfo& SafeTensors::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw IndexError(cat("no tensor named ", quote(name), " in '", path(), "'"));
  return tensors_[it->second];
}

bool SafeTensors::contains(const std::string& name) const { return index_.count(name) != 0; }

Array SafeTensors::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint8_t* p = file_->data() + data_start_ + t.begin;
  size_t nbytes = size_t(t.end - t.begin);
  if (reinterpret_cast<uintptr_t>(p) % itemsize(t.dtype) != 0) {
    Array a = Array::empty(t.shape, t.dtype, Device::cpu());
    if (nbytes) std::memcpy(a.data(), p, nbytes);
    return a;
  }
  return Array::from_blob(const_cast<uint8_t*>(p), t.shape, contiguous_strides(t.shape), t.dtype, Device::cpu(),
                          std::shared_ptr<void>(file_), nbytes);
}

// ---- writer ----
namespace {

void json_string(std::string& out, const std::string& s, const char* what) {
  if (!detail::valid_utf8(s)) throw ValueError(cat(what, ": ", quote(s), " is not valid UTF-8"));
  out += '"';
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  out += '"';
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Array>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<Array> host;
  std::map<std::string, int> seen;
  host.reserve(tensors.size());
  for (auto& [name, a] : tensors) {
    if (name == "__metadata__") throw ValueError("tensors: '__metadata__' is reserved and cannot name a tensor");
    if (!seen.emplace(name, 0).second) throw ValueError(cat("tensors: duplicate name ", quote(name)));
    if (!a.defined()) throw ValueError(cat("tensors: ", quote(name), " is not a defined array"));
    host.push_back(a.to(Device::cpu()).contiguous());
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return host[a].itemsize() > host[b].itemsize(); });
  std::string hdr = "{";
  if (!metadata.empty()) {
    hdr += "\"__metadata__\":{";
    bool first = true;
    for (auto& [k, v] : metadata) {
      if (!first) hdr += ',';
      first = false;
      json_string(hdr, k, "metadata key");
      hdr += ':';
      json_string(hdr, v, "metadata value");
    }
    hdr += '}';
  }
  uint64_t off = 0;
  for (size_t n = 0; n < order.size(); ++n) {
    size_t k = order[n];
    const Array& a = host[k];
    if (n || !metadata.empty()) hdr += ',';
    json_string(hdr, tensors[k].first, "tensor name");
    hdr += cat(":{\"dtype\":\"", safetensors_dtype_name(a.dtype()), "\",\"shape\":[");
    for (int d = 0; d < a.ndim(); ++d) hdr += cat(d ? "," : "", a.shape()[d]);
    hdr += cat("],\"data_offsets\":[", off, ",", off + a.nbytes(), "]}");
    off += a.nbytes();
  }
  hdr += '}';
  while (hdr.size() % 8) hdr += ' ';
  if (hdr.size() > kMaxHeader) throw ValueError(cat("tensors: the header would exceed ", kMaxHeader, " bytes"));

  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw ValueError(cat("cannot write '", tmp, "': ", std::strerror(errno)));
  bool ok = true;
  uint64_t n = hdr.size();
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = uint8_t(n >> (8 * b));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(hdr.data(), 1, hdr.size(), f) == hdr.size();
  for (size_t k : order)
    if (host[k].nbytes()) ok = ok && std::fwrite(host[k].data(), 1, host[k].nbytes(), f) == host[k].nbytes();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw ValueError(cat("cannot write '", path, "': ", std::strerror(e)));
  }
}

}  // namespace gk::io
