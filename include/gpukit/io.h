// Readers for model files: safetensors and GGUF. Files are untrusted input: every
// size, count, offset and length is checked against the file and against
// overflow before use; violations raise gk::FormatError naming the problem.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpukit/array.h"

namespace gk::io {

// A read-only memory map of a whole file (shared by the arrays that view it).
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// ---- safetensors ----
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
};

class SafeTensors {
 public:
  explicit SafeTensors(const std::string& path);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& info(const std::string& name) const;  // IndexError-like ValueError if absent
  bool contains(const std::string& name) const;
  // Zero-copy CPU view of the tensor (keeps the mapping alive).
  Array get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Array>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// ---- GGUF (versions 2 and 3) ----
enum class GGUFType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

struct GGUFValue {
  GGUFType type = GGUFType::U32;
  uint64_t u = 0;     // unsigned and bool values
  int64_t i = 0;      // signed values
  double f = 0;       // float values
  std::string s;      // String
  GGUFType elem_type = GGUFType::U32;  // Array
  std::vector<GGUFValue> arr;          // Array (may nest)

  int64_t as_int() const;            // any integer or bool type; FormatError otherwise
  double as_float() const;           // any numeric type
  const std::string& as_string() const;
  std::vector<std::string> as_strings() const;   // Array of String
  std::vector<int64_t> as_ints() const;          // Array of integers
  std::vector<double> as_floats() const;         // Array of numbers
};

// ggml tensor types (the numbering of the GGUF format).
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};
const char* ggml_type_name(GGMLType t);

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the fastest-varying
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;        // relative to the data section
  uint64_t nbytes = 0;
  // Shape in row-major (NumPy) order: reversed dims.
  Shape shape() const;
};

class GGUF {
 public:
  explicit GGUF(const std::string& path);
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GGUFValue>& metadata() const { return metadata_; }
  const GGUFValue* find(const std::string& key) const;  // null when absent
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo& info(const std::string& name) const;
  // The tensor's raw bytes (its quantized blocks) as a uint8 CPU view.
  Array raw(const std::string& name) const;
  // Dequantized values as float32 or bfloat16, in row-major shape.
  Array dequantize(const std::string& name, DType dtype = DType::f32) const;
  const std::string& path() const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace gk::io
