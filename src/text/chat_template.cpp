#include "gpukit/errors.h"
#include "gpukit/text.h"
namespace gk::text {
std::string render_chat(std::string_view, const std::vector<ChatMessage>&, const ChatOptions&) {
  throw ValueError("render_chat: not implemented");
}
}  // namespace gk::text
