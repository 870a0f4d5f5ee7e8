// Bindings for gpukit.text: tokenizers, streaming decoder, chat templates.
#include <nanobind/stl/pair.h>

#include <climits>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/text.h"

using namespace nb::literals;
using gk::text::ChatMessage;
using gk::text::StreamDecoder;
using gk::text::Tokenizer;

namespace {

// str -> UTF-8; bytes -> as is (invalid UTF-8 is replaced by U+FFFD when encoding).
std::string text_arg(nb::handle h, const char* arg) {
  if (nb::isinstance<nb::str>(h)) {
    Py_ssize_t n;
    const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
    if (!p) {
      PyErr_Clear();  // lone surrogates: pass them through; encode() then replaces them by U+FFFD
      nb::object b = nb::steal(PyUnicode_AsEncodedString(h.ptr(), "utf-8", "surrogatepass"));
      if (!b) throw nb::python_error();
      return std::string(PyBytes_AsString(b.ptr()), size_t(PyBytes_Size(b.ptr())));
    }
    return std::string(p, size_t(n));
  }
  if (nb::isinstance<nb::bytes>(h)) {
    nb::bytes b = nb::borrow<nb::bytes>(h);
    return std::string(b.c_str(), b.size());
  }
  if (PyByteArray_Check(h.ptr()))
    return std::string(PyByteArray_AsString(h.ptr()), size_t(PyByteArray_Size(h.ptr())));
  throw gk::TypeError(gk::cat(arg, ": expected str or bytes, got ", nb::type_name(h.type()).c_str()));
}

std::vector<int32_t> ids_arg(nb::handle h) {
  std::vector<int32_t> out;
  if (nb::isinstance<nb::int_>(h)) throw gk::TypeError("ids: expected a sequence of ints, got int");
  nb::object it = nb::steal(PyObject_GetIter(h.ptr()));
  if (!it) {
    PyErr_Clear();
    throw gk::TypeError(gk::cat("ids: expected a sequence of ints, got ", nb::type_name(h.type()).c_str()));
  }
  size_t i = 0;
  for (nb::handle x : nb::borrow<nb::iterator>(it)) {
    PyObject* idx = PyNumber_Index(x.ptr());
    if (!idx) {
      PyErr_Clear();
      throw gk::TypeError(gk::cat("ids[", i, "]: expected an int"));
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (overflow || v < INT32_MIN || v > INT32_MAX)
      throw gk::IndexError(gk::cat("ids[", i, "]: token id out of range"));
    out.push_back(int32_t(v));
    ++i;
  }
  return out;
}

template <class T>
T get(const nb::dict& d, const char* key, T dflt) {
  if (!d.contains(key)) return dflt;
  nb::handle v = d[key];
  try {
    return nb::cast<T>(v);
  } catch (const std::exception&) {
    throw gk::FormatError(gk::cat(key, ": unexpected value type ", nb::type_name(v.type()).c_str()));
  }
}

std::vector<std::string> strings(const nb::dict& d, const char* key) {
  std::vector<std::string> out;
  if (!d.contains(key)) return out;
  nb::handle v = d[key];
  for (nb::handle x : v) {
    if (nb::isinstance<nb::bytes>(x)) {
      nb::bytes b = nb::borrow<nb::bytes>(x);
      out.emplace_back(b.c_str(), b.size());
    } else {
      out.push_back(text_arg(x, key));
    }
  }
  return out;
}

Tokenizer from_metadata(const nb::dict& d) {
  gk::text::GGUFTokenizerData g;
  g.model = get<std::string>(d, "tokenizer.ggml.model", "");
  g.pre = get<std::string>(d, "tokenizer.ggml.pre", "");
  g.tokens = strings(d, "tokenizer.ggml.tokens");
  g.merges = strings(d, "tokenizer.ggml.merges");
  g.scores = get<std::vector<double>>(d, "tokenizer.ggml.scores", {});
  g.token_types = get<std::vector<int64_t>>(d, "tokenizer.ggml.token_type", {});
  g.bos_id = get<int64_t>(d, "tokenizer.ggml.bos_token_id", -1);
  g.eos_id = get<int64_t>(d, "tokenizer.ggml.eos_token_id", -1);
  g.unk_id = get<int64_t>(d, "tokenizer.ggml.unknown_token_id", -1);
  g.pad_id = get<int64_t>(d, "tokenizer.ggml.padding_token_id", -1);
  if (d.contains("tokenizer.ggml.add_bos_token")) g.add_bos = get<bool>(d, "tokenizer.ggml.add_bos_token", false);
  if (d.contains("tokenizer.ggml.add_eos_token")) g.add_eos = get<bool>(d, "tokenizer.ggml.add_eos_token", false);
  if (d.contains("tokenizer.ggml.add_space_prefix"))
    g.add_space_prefix = get<bool>(d, "tokenizer.ggml.add_space_prefix", true);
  g.chat_template = get<std::string>(d, "tokenizer.chat_template", "");
  nb::gil_scoped_release r;
  return Tokenizer::from_gguf_data(g);
}

}  // namespace

GK_BINDING(40, text) {
  nb::module_ t = m.def_submodule("text", "Tokenizers and chat templates");
  nb::class_<Tokenizer>(t, "Tokenizer", "Byte-level or SentencePiece BPE tokenizer (thread-safe, immutable)")
      .def_static(
          "from_json",
          [](nb::handle js, nb::handle cfg) {
            std::string a = text_arg(js, "json"), b = cfg.is_none() ? std::string() : text_arg(cfg, "config");
            nb::gil_scoped_release r;
            return Tokenizer::from_json(a, b);
          },
          "json"_a, "config"_a = nb::none(), "A tokenizer from tokenizer.json text (and tokenizer_config.json text)")
      .def_static(
          "from_file",
          [](const std::string& path) {
            nb::gil_scoped_release r;
            return Tokenizer::from_file(path);
          },
          "path"_a, "A tokenizer from a tokenizer.json path (reads tokenizer_config.json beside it)")
      .def_static("from_gguf_metadata", &from_metadata, "metadata"_a,
                  "A tokenizer from a dict of GGUF tokenizer.ggml.* keys")
      .def(
          "encode",
          [](const Tokenizer& self, nb::handle text, bool add_special_tokens, bool parse_special) {
            std::string s = text_arg(text, "text");
            nb::gil_scoped_release r;
            return self.encode(s, add_special_tokens, parse_special);
          },
          "text"_a, "add_special_tokens"_a = true, "parse_special"_a = true,
          "Token ids of text (str, or bytes: invalid UTF-8 is replaced by U+FFFD)")
      .def(
          "decode",
          [](const Tokenizer& self, nb::handle ids, bool skip) {
            std::vector<int32_t> v = ids_arg(ids);
            std::string out;
            {
              nb::gil_scoped_release r;
              out = self.decode(v, skip);
            }
            return nb::str(out.data(), out.size());
          },
          "ids"_a, "skip_special_tokens"_a = false)
      .def(
          "token_bytes", [](const Tokenizer& self, int32_t id) {
            std::string b = self.token_bytes(id);
            return nb::bytes(b.data(), b.size());
          },
          "id"_a, "The raw bytes one token stands for")
      .def(
          "decoder", [](const Tokenizer& self, bool skip) { return StreamDecoder(self, skip); },
          "skip_special_tokens"_a = false, "An incremental decoder for streaming")
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def_prop_ro("bos_id", [](const Tokenizer& s) -> std::optional<int32_t> {
        if (s.bos_id() < 0) return std::nullopt;
        return s.bos_id();
      })
      .def_prop_ro("eos_id", [](const Tokenizer& s) -> std::optional<int32_t> {
        if (s.eos_id() < 0) return std::nullopt;
        return s.eos_id();
      })
      .def_prop_ro("chat_template", [](const Tokenizer& s) -> std::optional<std::string> {
        if (s.chat_template().empty()) return std::nullopt;
        return s.chat_template();
      })
      .def_prop_ro("kind", &Tokenizer::kind)
      .def_prop_ro("pre_tokenizer", &Tokenizer::pre_tokenizer)
      .def("token_to_id", [](const Tokenizer& s, nb::handle tok) { return s.token_to_id(text_arg(tok, "token")); },
           "token"_a)
      .def("id_to_token", [](const Tokenizer& s, int64_t id) {
            if (id < 0 || id >= s.vocab_size())
              throw gk::IndexError(gk::cat("id: token id ", id, " out of range [0, ", s.vocab_size(), ")"));
            return s.id_to_token(int32_t(id));
          }, "id"_a)
      .def("is_special", &Tokenizer::is_special, "id"_a)
      .def("__len__", &Tokenizer::vocab_size);

  nb::class_<StreamDecoder>(t, "StreamDecoder", "Incremental decoder that never emits half a UTF-8 character")
      .def(nb::init<Tokenizer, bool>(), "tokenizer"_a, "skip_special_tokens"_a = false)
      .def(
          "push",
          [](StreamDecoder& d, nb::handle ids) {
            std::string s;
            if (nb::isinstance<nb::int_>(ids)) {
              std::vector<int32_t> v = ids_arg(nb::make_tuple(ids));
              s = d.push(v[0]);
            } else {
              s = d.push(ids_arg(ids));
            }
            return nb::str(s.data(), s.size());
          },
          "ids"_a, "Adds one id or a sequence of ids; returns the newly completed text")
      .def("flush", [](StreamDecoder& d) {
        std::string s = d.flush();
        return nb::str(s.data(), s.size());
      })
      .def_prop_ro("pending_bytes", &StreamDecoder::pending_bytes);

  t.def(
      "_render_chat",
      [](const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& msgs,
         bool add_generation_prompt, const std::string& bos, const std::string& eos) {
        std::vector<ChatMessage> m;
        for (auto& [r, c] : msgs) m.push_back({r, c});
        gk::text::ChatOptions o;
        o.add_generation_prompt = add_generation_prompt;
        o.bos_token = bos;
        o.eos_token = eos;
        std::string out;
        {
          nb::gil_scoped_release r;
          out = gk::text::render_chat(tmpl, m, o);
        }
        return out;
      },
      "template"_a, "messages"_a, "add_generation_prompt"_a, "bos_token"_a, "eos_token"_a);
}
