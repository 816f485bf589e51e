#include "src/cluster/json_parse.h"

#include <string>

#include "src/cluster/host_lists.h"

namespace rdmaps::internal {

Result<nlohmann::json> ParseJsonLimited(std::string_view text, std::string_view what,
                                        std::string_view invalid) {
  if (text.size() > kMaxJsonBytes) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(text.size()) +
                                " bytes of JSON exceed the limit of " +
                                std::to_string(kMaxJsonBytes));
  }
  // The callback sees every value with its depth; one too deep is dropped
  // (returning false), which keeps the parser's own work iterative, and
  // the whole parse is refused below.
  int deepest = 0;
  const nlohmann::json::parser_callback_t depth_check =
      [&deepest](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if (event == nlohmann::json::parse_event_t::object_start ||
            event == nlohmann::json::parse_event_t::array_start) {
          if (depth + 1 > deepest) deepest = depth + 1;
          return depth < kMaxJsonDepth;
        }
        return true;
      };
  nlohmann::json j = nlohmann::json::parse(text, depth_check, /*allow_exceptions=*/false);
  if (deepest > kMaxJsonDepth) {
    return InvalidArgumentError(std::string(what) + ": JSON nested more than " +
                                std::to_string(kMaxJsonDepth) + " levels deep: " + Quote(text));
  }
  if (j.is_discarded()) {
    return InvalidArgumentError(std::string(what) + " " + std::string(invalid) + ": " +
                                Quote(text));
  }
  return j;
}

}  // namespace rdmaps::internal
