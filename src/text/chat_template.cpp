// render_chat: parses a chat template and renders it with the conversation.
#include "gpukit/errors.h"
#include "gpukit/text.h"
#include "text/jinja.h"
#include "core/utf8.h"

namespace gk::text {

std::string render_chat(std::string_view chat_template, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options) {
  if (chat_template.size() > (size_t(1) << 24)) throw ValueError("chat_template: longer than 16 MiB");
  jinja::NodeP root = jinja::parse(chat_template);
  jinja::List msgs;
  for (auto& m : messages)
    msgs.push_back(jinja::Value::make_dict({{"role", jinja::Value::str(m.role)}, {"content", jinja::Value::str(m.content)}}));
  std::map<std::string, jinja::Value> g;
  g["messages"] = jinja::Value::make_list(std::move(msgs));
  g["add_generation_prompt"] = jinja::Value::boolean(options.add_generation_prompt);
  g["bos_token"] = jinja::Value::str(options.bos_token);
  g["eos_token"] = jinja::Value::str(options.eos_token);
  jinja::Limits lim;
  lim.max_steps = options.max_steps;
  lim.max_output = options.max_output_bytes;
  std::string out = jinja::render(*root, g, lim);
  return utf8::is_valid(out) ? out : utf8::sanitize(out);
}

}  // namespace gk::text
