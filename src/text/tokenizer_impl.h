// Internal representation shared by the tokenizer loaders, encoder and decoder.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gpukit/text.h"

namespace gk::text::detail {

// Open-addressing string -> id table (keys point into TokenizerImpl-owned strings).
class StrTable {
 public:
  void build(const std::vector<std::pair<std::string_view, int32_t>>& items);  // first key wins
  int32_t find(std::string_view key) const;  // -1 when absent
 private:
  std::vector<std::string_view> keys_;
  std::vector<int32_t> vals_;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id), open addressing.
class PairTable {
 public:
  void reserve(size_t n);
  bool insert(int32_t a, int32_t b, int32_t rank, int32_t merged);  // false if the pair exists
  // Returns false when absent.
  bool find(int32_t a, int32_t b, int32_t* rank, int32_t* merged) const {
    if (mask_ == 0) return false;
    uint64_t k = key(a, b);
    for (size_t h = mix(k) & mask_;; h = (h + 1) & mask_) {
      const Slot& s = slots_[h];
      if (s.k == k) {
        *rank = s.rank;
        *merged = s.merged;
        return true;
      }
      if (s.k == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t k = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return size_t(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
};

enum class Model { ByteBPE, SpmBPE };
enum class PreStep { Gpt2, Llama3, Qwen2, DigitsIndividual, DigitsGrouped };

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// Byte trie over added-token contents (leftmost-longest matching).
struct Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;  // (byte, child node)
    int32_t added = -1;                              // index into TokenizerImpl::added
  };
  std::vector<Node> nodes;
  bool first[256] = {};
  int32_t child(int32_t node, uint8_t b) const {
    for (auto& [c, k] : nodes[node].kids)
      if (c == b) return k;
    return -1;
  }
};

struct TokenizerImpl {
  Model model = Model::ByteBPE;
  std::vector<PreStep> pre_steps;
  std::string pre_name;
  bool add_prefix_space = false;   // ByteLevel(add_prefix_space=true)
  bool ignore_merges = false;      // a pre-token that is itself a vocab entry is emitted whole
  bool byte_fallback = false;      // unknown bytes -> <0xNN>
  bool add_space_prefix = false;   // SentencePiece: prepend U+2581 to each text segment
  bool strip_decoded_space = false;  // SentencePiece decoder: drop one leading space
  bool nfc_declared = false;       // tokenizer.json asked for NFC (not applied; input assumed NFC)

  std::vector<std::string> id_to_token;  // holes are ""
  std::vector<std::string> id_bytes;     // decoded bytes of each token
  std::vector<uint8_t> special;          // skipped by decode(skip_special_tokens=true)
  std::vector<float> scores;             // SentencePiece merge scores
  StrTable vocab;        // token string -> id (model vocab and added tokens)
  StrTable bytes_vocab;  // decoded bytes -> id (byte-level ignore_merges lookups)
  PairTable merges;      // byte-level BPE
  int32_t byte_ids[256];  // initial symbol per byte (byte-level) or <0xNN> (fallback), -1 if none
  int32_t unk_id = -1;

  std::vector<AddedToken> added;  // matched before pre-tokenization
  Trie trie;
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor (add_special_tokens=True)
  int32_t bos = -1, eos = -1;
  std::string chat_template;

  // Derived: build tables after ids/tokens are set.
  void finalize();
  void encode_segment(std::string_view seg, bool first_segment, bool after_special,
                      std::vector<int32_t>& out) const;
};

void build_trie(TokenizerImpl& t);

// Loaders (load_json.cpp, load_gguf.cpp).
std::shared_ptr<TokenizerImpl> load_json(std::string_view tokenizer_json, std::string_view config_json);
std::shared_ptr<TokenizerImpl> load_gguf_data(const GGUFTokenizerData& d);

// Pre-tokenizer: calls emit(begin, end) with byte offsets of each piece of `text`
// (valid UTF-8) in order (pretokenize.cpp).
void pretokenize(const std::vector<PreStep>& steps, std::string_view text,
                 const std::function<void(size_t, size_t)>& emit);

// BPE merge loops (bpe.cpp). Symbols are token ids; results are appended to out.
void bpe_merge_ids(const PairTable& merges, std::vector<int32_t>& syms, std::vector<int32_t>& out);
void spm_encode(const TokenizerImpl& t, std::string_view text, std::vector<int32_t>& out);

// The GPT-2 byte <-> unicode map.
uint32_t byte_to_cp(uint8_t b);
int byte_from_cp(uint32_t cp);  // -1 when cp is not in the map
std::string byte_symbol(uint8_t b);  // the UTF-8 of byte_to_cp(b): byte b's vocabulary symbol

}  // namespace gk::text::detail
