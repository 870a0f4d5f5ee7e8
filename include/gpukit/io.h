// Readers for model files: safetensors and GGUF. Files are untrusted input: every
// size, count, offset and length is checked against the file and against
// overflow before use; violations raise gk::FormatError naming the problem.
// Memory use while parsing stays within a small multiple of the file size (about
// 1-2x for real files; at worst ~14x, for GGUF arrays of empty arrays).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpukit/array.h"

namespace gk::io {

// A read-only memory map of a whole file (shared by the arrays that view it), or
// an owned copy of bytes (from_bytes: fuzzing, tests, in-memory files).
class MappedFile {
 public:
  // Throws ValueError when the file cannot be opened or is not a regular file.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  static std::shared_ptr<MappedFile> from_bytes(const void* data, size_t size, std::string name = "<memory>");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  std::string path_;
};

// ---- safetensors ----
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
};

// safetensors dtype names ("F32", "BF16", ...) <-> DType.
const char* safetensors_dtype_name(DType t);

class SafeTensors {
 public:
  explicit SafeTensors(const std::string& path);
  explicit SafeTensors(std::shared_ptr<MappedFile> file);
  // Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& info(const std::string& name) const;  // IndexError naming the tensor if absent
  bool contains(const std::string& name) const;
  // Zero-copy CPU view of the tensor (keeps the mapping alive). A tensor whose
  // bytes are not aligned to its item size (possible in files from other
  // writers) is copied into aligned memory instead.
  Array get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }
  uint64_t data_start() const { return data_start_; }

 private:
  void parse();
  std::shared_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; non-contiguous arrays are made contiguous) with the
// data ordered by item size, largest first, so every tensor is aligned; the
// header is padded with spaces to a multiple of 8 bytes. Writes to a temporary
// file and renames it over `path`.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Array>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A sharded checkpoint: a directory holding model.safetensors.index.json (or a
// single *.safetensors file), the index file itself, or one .safetensors file.
// Shard names in the index must be plain file names inside the index's directory.
class ShardedSafeTensors {
 public:
  explicit ShardedSafeTensors(const std::string& path);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  Array get(const std::string& name) const;
  const SafeTensors& shard_of(const std::string& name) const;
  const std::vector<std::shared_ptr<SafeTensors>>& shards() const { return shards_; }
  // __metadata__ of the first shard.
  const std::map<std::string, std::string>& metadata() const;

 private:
  std::vector<std::shared_ptr<SafeTensors>> shards_;
  std::map<std::string, size_t> where_;
};

// ---- GGUF (versions 2 and 3) ----
enum class GGUFType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GGUFType t);

// One metadata value. Scalars use u (unsigned, bool), i (signed), f (floats) or s.
// Arrays are stored compactly: numbers as their raw little-endian bytes in
// `data`, strings concatenated in `data` with end offsets in `str_ends`, and
// arrays of arrays as `arr`. Use size() / the as_* accessors.
struct GGUFValue {
  GGUFType type = GGUFType::U32;
  uint64_t u = 0;     // unsigned and bool values
  int64_t i = 0;      // signed values
  double f = 0;       // float values
  std::string s;      // String
  GGUFType elem_type = GGUFType::U32;  // Array
  uint64_t count = 0;                  // Array: number of elements
  std::string data;                    // Array of numbers / strings: see above
  std::vector<uint64_t> str_ends;      // Array of String
  std::vector<GGUFValue> arr;          // Array of Array (bounded nesting depth)

  bool is_array() const { return type == GGUFType::Array; }
  size_t size() const { return is_array() ? size_t(count) : 1; }
  GGUFValue at(size_t k) const;      // element k of an array (a scalar or nested array value)

  int64_t as_int() const;            // any integer or bool type; FormatError otherwise
  uint64_t as_uint() const;          // any non-negative integer or bool
  double as_float() const;           // any numeric type
  const std::string& as_string() const;
  std::string string_at(size_t k) const;         // Array of String
  std::vector<std::string> as_strings() const;   // Array of String
  std::vector<int64_t> as_ints() const;          // Array of integers (or bools)
  std::vector<double> as_floats() const;         // Array of numbers
};

// ggml tensor types (the numbering of the GGUF format). Every listed type can be
// read raw; dequantize() supports F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19,
  IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
const char* ggml_type_name(GGMLType t);
// Elements per block and bytes per block; false for unknown types.
bool ggml_type_size(uint32_t type, uint32_t* block_elems, uint32_t* block_bytes);
bool ggml_can_dequantize(GGMLType t);

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the fastest-varying
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;        // relative to the data section
  uint64_t nbytes = 0;
  int64_t numel = 0;
  // Shape in row-major (NumPy) order: reversed dims.
  Shape shape() const;
};

class GGUF {
 public:
  static constexpr int kMaxArrayDepth = 8;  // arrays of arrays nest at most this deep
  explicit GGUF(const std::string& path);
  explicit GGUF(std::shared_ptr<MappedFile> file);
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_start() const { return data_start_; }
  const std::map<std::string, GGUFValue>& metadata() const { return metadata_; }
  const std::vector<std::string>& metadata_order() const { return key_order_; }  // file order
  const GGUFValue* find(const std::string& key) const;  // null when absent
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }  // file order
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const GGUFTensorInfo& info(const std::string& name) const;  // IndexError if absent
  // The tensor's raw bytes (its quantized blocks) as a zero-copy uint8 CPU view of
  // shape (*shape[:-1], bytes per row).
  Array raw(const std::string& name) const;
  // Pointer to the tensor's bytes inside the mapping (valid while this object lives).
  const uint8_t* raw_data(const std::string& name) const;
  // Dequantized values as float32 or bfloat16, in row-major shape.
  Array dequantize(const std::string& name, DType dtype = DType::f32) const;
  const std::string& path() const { return file_->path(); }

 private:
  void parse();
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<std::string> key_order_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Dequantizes `n_elems` values (a multiple of the block size) of `type` from
// `src` (n_elems / block_elems blocks) into float32 or bfloat16 `dst`.
void dequantize_blocks(GGMLType type, const uint8_t* src, int64_t n_elems, DType out, void* dst);

}  // namespace gk::io
