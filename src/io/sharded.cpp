// Sharded safetensors checkpoints (model.safetensors.index.json).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "io/json.h"
#include "io/reader.h"

namespace gk::io {
namespace fs = std::filesystem;
using detail::quote;

namespace {

constexpr uint64_t kMaxIndex = 100'000'000;

// weight_map of an index file: tensor name -> shard file name.
std::map<std::string, std::string> read_index(const fs::path& p) {
  const std::string what = cat("index file '", p.string(), "'");
  auto file = MappedFile::open(p.string());
  if (file->size() > kMaxIndex) throw FormatError(cat(what, ": larger than ", kMaxIndex, " bytes"));
  std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());
  detail::JsonReader j(text, what);
  std::map<std::string, std::string> map;
  bool have_map = false, first = true;
  std::string key;
  j.begin_object("index");
  while (j.next_key(key, first, "index")) {
    if (key != "weight_map") {
      j.skip_value(1);
      continue;
    }
    if (have_map) throw FormatError(cat(what, ": duplicate key 'weight_map'"));
    have_map = true;
    j.begin_object("weight_map");
    bool f = true;
    std::string name;
    while (j.next_key(name, f, "weight_map")) {
      std::string shard = j.string("shard file name");
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
          shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
        throw FormatError(cat(what, ": shard file name ", quote(shard), " for tensor ", quote(name),
                              " must be a plain file name in the index's directory"));
      if (!map.emplace(name, shard).second) throw FormatError(cat(what, ": duplicate tensor name ", quote(name)));
    }
  }
  j.finish();
  if (!have_map) throw FormatError(cat(what, ": no 'weight_map'"));
  return map;
}

}  // namespace

ShardedSafeTensors::ShardedSafeTensors(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  fs::path index;
  std::vector<fs::path> singles;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec)) {
      index = p / "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors", ec)) {
      singles.push_back(p / "model.safetensors");
    } else {
      for (auto& e : fs::directory_iterator(p, ec))
        if (e.path().extension() == ".safetensors") singles.push_back(e.path());
      std::sort(singles.begin(), singles.end());
      if (singles.empty()) {
        // A lone index with another name.
        for (auto& e : fs::directory_iterator(p, ec))
          if (e.path().string().size() > 22 &&
              e.path().filename().string().ends_with(".safetensors.index.json"))
            index = e.path();
        if (index.empty())
          throw ValueError(cat("'", path, "' holds no .safetensors files and no model.safetensors.index.json"));
      }
    }
  } else if (p.extension() == ".json") {
    index = p;
  } else {
    singles.push_back(p);
  }
  if (!index.empty()) {
    auto map = read_index(index);
    std::map<std::string, size_t> shard_idx;
    for (auto& [name, shard] : map) {
      auto it = shard_idx.find(shard);
      if (it == shard_idx.end()) {
        it = shard_idx.emplace(shard, shards_.size()).first;
        shards_.push_back(std::make_shared<SafeTensors>((index.parent_path() / shard).string()));
      }
      if (!shards_[it->second]->contains(name))
        throw FormatError(cat("index file '", index.string(), "': tensor ", quote(name), " is not in shard ",
                              quote(shard)));
      where_[name] = it->second;
    }
    return;
  }
  for (auto& s : singles) {
    shards_.push_back(std::make_shared<SafeTensors>(s.string()));
    for (auto& t : shards_.back()->tensors())
      if (!where_.emplace(t.name, shards_.size() - 1).second)
        throw FormatError(cat("tensor ", quote(t.name), " appears in more than one file under '", path, "'"));
  }
}

std::vector<std::string> ShardedSafeTensors::names() const {
  std::vector<std::string> r;
  r.reserve(where_.size());
  for (auto& [k, v] : where_) r.push_back(k);
  return r;
}

const SafeTensors& ShardedSafeTensors::shard_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw IndexError(cat("no tensor named ", quote(name), " in the checkpoint"));
  return *shards_[it->second];
}

const TensorInfo& ShardedSafeTensors::info(const std::string& name) const { return shard_of(name).info(name); }
Array ShardedSafeTensors::get(const std::string& name) const { return shard_of(name).get(name); }

const std::map<std::string, std::string>& ShardedSafeTensors::metadata() const {
  static const std::map<std::string, std::string> empty;
  return shards_.empty() ? empty : shards_.front()->metadata();
}

}  // namespace gk::io
