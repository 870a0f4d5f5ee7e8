// GGUF reader (versions 2 and 3).
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count, the
// metadata key/value pairs, the tensor infos (name, u32 n_dims, u64 dims[n_dims],
// u32 type, u64 offset), padding to general.alignment, then the data section.
// Strings are u64 length + bytes; arrays are u32 element type + u64 count +
// elements. Every count is checked against the bytes left in the file before
// any memory is reserved, so parsing never allocates more than a small multiple
// of the file size.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "io/reader.h"

namespace gk::io {
using detail::ByteReader;
using detail::quote;

namespace {

constexpr uint64_t kMaxString = uint64_t(1) << 30;  // 1 GiB
constexpr uint64_t kMaxArray = uint64_t(1) << 30;   // elements

struct TypeSize {
  uint32_t type, block, bytes;
  const char* name;
};
constexpr TypeSize kTypes[] = {
    {0, 1, 4, "F32"},         {1, 1, 2, "F16"},         {2, 32, 18, "Q4_0"},       {3, 32, 20, "Q4_1"},
    {6, 32, 22, "Q5_0"},      {7, 32, 24, "Q5_1"},      {8, 32, 34, "Q8_0"},                     
    {10, 256, 84, "Q2_K"},    {11, 256, 110, "Q3_K"},   {12, 256, 144, "Q4_K"},    {13, 256, 176, "Q5_K"},
    {14, 256, 210, "Q6_K"},   {15, 256, 292, "Q8_K"},   {16, 256, 66, "IQ2_XXS"},  {17, 256, 74, "IQ2_XS"},
    {18, 256, 98, "IQ3_XXS"}, {19, 256, 50, "IQ1_S"},   {20, 32, 18, "IQ4_NL"},    {21, 256, 110, "IQ3_S"},
    {22, 256, 82, "IQ2_S"},   {23, 256, 136, "IQ4_XS"}, {24, 1, 1, "I8"},          {25, 1, 2, "I16"},
    {26, 1, 4, "I32"},        {27, 1, 8, "I64"},        {28, 1, 8, "F64"},         {29, 256, 56, "IQ1_M"},
    {30, 1, 2, "BF16"},       {34, 256, 54, "TQ1_0"},   {35, 256, 66, "TQ2_0"},    {39, 32, 17, "MXFP4"},
};

const TypeSize* find_type(uint32_t t) {
  for (auto& e : kTypes)
    if (e.type == t) return &e;
  return nullptr;
}

bool known_value_type(uint32_t t) { return t <= 12; }

uint64_t min_encoded_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::Bool: return 1;
    case GGUFType::U16: case GGUFType::I16: return 2;
    case GGUFType::U32: case GGUFType::I32: case GGUFType::F32: return 4;
    case GGUFType::U64: case GGUFType::I64: case GGUFType::F64: case GGUFType::String: return 8;
    case GGUFType::Array: return 12;
  }
  return 1;
}

class Parser {
 public:
  Parser(const MappedFile& f, const std::string& what) : r(f.data(), f.size(), what) {}
  ByteReader r;

  std::string_view str(const char* field) {
    uint64_t n = r.read<uint64_t>(field);
    if (n > kMaxString) r.fail(cat(field, ": string length ", n, " exceeds the 1 GiB limit"));
    if (n > r.remaining())
      r.fail(cat(field, ": string length ", n, " exceeds the ", r.remaining(), " bytes left in the file"));
    return r.bytes(n, field);
  }

  GGUFType value_type(const char* field) {
    uint32_t t = r.read<uint32_t>(field);
    if (!known_value_type(t)) r.fail(cat(field, ": unknown metadata value type ", t));
    return GGUFType(t);
  }

  void scalar(GGUFValue& v, GGUFType t, const char* field) {
    v.type = t;
    switch (t) {
      case GGUFType::U8: v.u = r.read<uint8_t>(field); break;
      case GGUFType::I8: v.i = r.read<int8_t>(field); break;
      case GGUFType::U16: v.u = r.read<uint16_t>(field); break;
      case GGUFType::I16: v.i = r.read<int16_t>(field); break;
      case GGUFType::U32: v.u = r.read<uint32_t>(field); break;
      case GGUFType::I32: v.i = r.read<int32_t>(field); break;
      case GGUFType::U64: v.u = r.read<uint64_t>(field); break;
      case GGUFType::I64: v.i = r.read<int64_t>(field); break;
      case GGUFType::F32: v.f = r.read<float>(field); break;
      case GGUFType::F64: v.f = r.read<double>(field); break;
      case GGUFType::Bool: v.u = r.read<uint8_t>(field) != 0; break;
      case GGUFType::String: v.s = std::string(str(field)); break;
      case GGUFType::Array: break;
    }
  }

  void value(GGUFValue& v, GGUFType t, int depth, const char* field) {
    if (t != GGUFType::Array) return scalar(v, t, field);
    if (depth >= GGUF::kMaxArrayDepth)
      r.fail(cat(field, ": metadata arrays nested deeper than ", GGUF::kMaxArrayDepth, " levels"));
    v.type = GGUFType::Array;
    v.elem_type = value_type(field);
    uint64_t n = r.read<uint64_t>(field);
    if (n > kMaxArray) r.fail(cat(field, ": array length ", n, " exceeds the limit of 2^30 elements"));
    uint64_t min = n * min_encoded_size(v.elem_type);  // n <= 2^30: no overflow
    if (min > r.remaining())
      r.fail(cat(field, ": array of ", n, " ", gguf_type_name(v.elem_type), " elements needs at least ", min,
                 " bytes but only ", r.remaining(), " remain"));
    v.count = n;
    if (v.elem_type == GGUFType::String) {
      v.str_ends.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) {
        v.data += str(field);
        v.str_ends.push_back(v.data.size());
      }
    } else if (v.elem_type == GGUFType::Array) {
      v.arr.resize(size_t(n));
      for (uint64_t k = 0; k < n; ++k) value(v.arr[size_t(k)], GGUFType::Array, depth + 1, field);
    } else {
      auto b = r.bytes(min, field);
      v.data.assign(b.data(), b.size());
      if (v.elem_type == GGUFType::Bool)
        for (char& c : v.data) c = c != 0;
    }
  }
};

}  // namespace

const char* gguf_type_name(GGUFType t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool", "string", "array", "uint64", "int64", "float64"};
  return uint32_t(t) <= 12 ? names[uint32_t(t)] : "unknown";
}

const char* ggml_type_name(GGMLType t) {
  auto* e = find_type(uint32_t(t));
  return e ? e->name : "unknown";
}

bool ggml_type_size(uint32_t type, uint32_t* block_elems, uint32_t* block_bytes) {
  auto* e = find_type(type);
  if (!e) return false;
  *block_elems = e->block;
  *block_bytes = e->bytes;
  return true;
}

Shape GGUFTensorInfo::shape() const { return Shape(dims.rbegin(), dims.rend()); }

GGUF::GGUF(const std::string& path) : file_(MappedFile::open(path)) { parse(); }
GGUF::GGUF(std::shared_ptr<MappedFile> file) : file_(std::move(file)) { parse(); }

void GGUF::parse() {
  const std::string what = cat("GGUF file '", file_->path(), "'");
  Parser p(*file_, what);
  ByteReader& r = p.r;
  auto magic = r.bytes(4, "magic");
  if (magic != "GGUF") r.fail(cat("wrong magic ", quote(magic), " (expected 'GGUF')"));
  version_ = r.read<uint32_t>("version");
  if (version_ == 0x02000000u || version_ == 0x03000000u) r.fail("big-endian GGUF files are not supported");
  if (version_ == 1) r.fail("GGUF version 1 is not supported (versions 2 and 3 are)");
  if (version_ != 2 && version_ != 3) r.fail(cat("unsupported GGUF version ", version_, " (versions 2 and 3 are)"));
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each metadata pair takes at least 13 bytes, each tensor info at least 24.
  if (n_kv > r.remaining() / 13)
    r.fail(cat("metadata count ", n_kv, " cannot fit in the ", r.remaining(), " bytes left in the file"));
  if (n_tensors > r.remaining() / 24)
    r.fail(cat("tensor count ", n_tensors, " cannot fit in the ", r.remaining(), " bytes left in the file"));

  key_order_.reserve(size_t(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(p.str("metadata key"));
    if (key.empty()) r.fail("empty metadata key");
    if (key.size() > 65535) r.fail(cat("metadata key of ", key.size(), " bytes (at most 65535 are allowed)"));
    if (!detail::valid_utf8(key)) r.fail(cat("metadata key ", quote(key), " is not valid UTF-8"));
    std::string field = cat("metadata ", quote(key));
    GGUFType t = p.value_type(field.c_str());
    GGUFValue v;
    p.value(v, t, 0, field.c_str());
    if (!metadata_.emplace(key, std::move(v)).second) r.fail(cat("duplicate metadata key ", quote(key)));
    key_order_.push_back(std::move(key));
  }
  if (const GGUFValue* a = find("general.alignment")) {
    if (a->type != GGUFType::U32)
      r.fail(cat("general.alignment must be a uint32, not ", gguf_type_name(a->type)));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      r.fail(cat("general.alignment ", a->u, " is not a power of two"));
    alignment_ = a->u;
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensorInfo t;
    t.name = std::string(p.str("tensor name"));
    std::string field = cat("tensor ", quote(t.name));
    if (!detail::valid_utf8(t.name)) r.fail(cat(field, ": name is not valid UTF-8"));
    if (index_.count(t.name)) r.fail(cat("duplicate tensor name ", quote(t.name)));
    uint32_t nd = r.read<uint32_t>(field.c_str());
    if (nd > 4) r.fail(cat(field, " has ", nd, " dimensions (at most 4 are allowed)"));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      int64_t v = r.read<int64_t>(field.c_str());
      if (v == 0) r.fail(cat(field, ": dimension ", d, " is zero"));
      if (v < 0) r.fail(cat(field, ": dimension ", d, " is negative (", v, ")"));
      if (detail::mul_ovf(numel, uint64_t(v), &numel) || numel > uint64_t(INT64_MAX))
        r.fail(cat(field, ": the product of the dimensions overflows 64 bits"));
      t.dims.push_back(v);
    }
    uint32_t type = r.read<uint32_t>(field.c_str());
    const TypeSize* ts = find_type(type);
    if (!ts) r.fail(cat(field, ": unknown tensor type ", type));
    t.type = GGMLType(type);
    int64_t row = nd ? t.dims[0] : 1;
    if (row % ts->block != 0)
      r.fail(cat(field, ": row length ", row, " is not a multiple of the ", ts->name, " block size ", ts->block));
    if (detail::mul_ovf(numel / ts->block, ts->bytes, &t.nbytes) || t.nbytes > uint64_t(INT64_MAX))
      r.fail(cat(field, ": size in bytes overflows 64 bits"));
    t.numel = int64_t(numel);
    t.offset = r.read<uint64_t>(field.c_str());
    if (t.offset % alignment_ != 0)
      r.fail(cat(field, ": data offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  uint64_t pos = r.pos();
  data_start_ = (pos + alignment_ - 1) / alignment_ * alignment_;  // pos < 2^63, alignment <= 2^31
  const uint64_t fsize = file_->size();
  if (!tensors_.empty() && data_start_ > fsize)
    r.fail(cat("the data section would start at ", data_start_, ", past the end of the file (", fsize, " bytes)"));
  const uint64_t data_size = data_start_ <= fsize ? fsize - data_start_ : 0;
  for (auto& t : tensors_) {
    uint64_t end;
    if (detail::add_ovf(t.offset, t.nbytes, &end) || end > data_size)
      throw FormatError(cat(what, ": tensor ", quote(t.name), " (", t.nbytes, " bytes at data offset ", t.offset,
                            ") extends past the end of the file (data section is ", data_size, " bytes)"));
  }
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(tensors_[a].offset, a) < std::pair(tensors_[b].offset, b);
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& a = tensors_[order[k - 1]];
    const auto& b = tensors_[order[k]];
    if (b.offset < a.offset + a.nbytes)
      throw FormatError(cat(what, ": tensor ", quote(b.name), " (data offset ", b.offset, ") overlaps tensor ",
                            quote(a.name), " (bytes ", a.offset, " to ", a.offset + a.nbytes, ")"));
  }
}

const GGUFValue* GGUF::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GGUFTensorInfo& GGUF::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw IndexError(cat("no tensor named ", quote(name), " in '", path(), "'"));
  return tensors_[it->second];
}

const uint8_t* GGUF::raw_data(const std::string& name) const {
  return file_->data() + data_start_ + info(name).offset;
}

Array GGUF::raw(const std::string& name) const {
  const GGUFTensorInfo& t = info(name);
  Shape s = t.shape();
  if (s.empty()) {
    s = {int64_t(t.nbytes)};
  } else {
    s.back() = int64_t(t.nbytes) / (t.numel / s.back());  // bytes per row
  }
  return Array::from_blob(const_cast<uint8_t*>(raw_data(name)), s, contiguous_strides(s), DType::u8, Device::cpu(),
                          std::shared_ptr<void>(file_), size_t(t.nbytes));
}

Array GGUF::dequantize(const std::string& name, DType dtype) const {
  const GGUFTensorInfo& t = info(name);
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw ValueError(cat("dtype: dequantize produces float32 or bfloat16, not ", dtype_name(dtype)));
  if (!ggml_can_dequantize(t.type))
    throw ValueError(cat("tensor ", quote(name), ": dequantizing ", ggml_type_name(t.type),
                         " is not supported (use raw() for its blocks)"));
  Array out = Array::empty(t.shape(), dtype, Device::cpu());
  dequantize_blocks(t.type, raw_data(name), t.numel, dtype, out.data());
  return out;
}

}  // namespace gk::io
