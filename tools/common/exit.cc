#include "tools/common/exit.h"

#include <cstdio>
#include <exception>
#include <new>
#include <string>

namespace rdmaps::tools {

int ExitCodeOf(const Status& s) {
  if (s.ok()) return kExitOk;
  return s.code() == StatusCode::kInvalidArgument ? kExitConfig : kExitRuntime;
}

int ReportStatus(std::string_view tool, const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(tool.size()), tool.data(),
                 s.ToString().c_str());
  }
  return ExitCodeOf(s);
}

int GuardedMain(std::string_view tool, const std::function<int()>& body) {
  const auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(tool.size()), tool.data(), why.c_str());
    std::fflush(stderr);
    return kExitRuntime;
  };
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail("out of memory (a size given in the flags or the table list is too large?)");
  } catch (const std::exception& e) {
    return fail(std::string("internal error: uncaught exception: ") + e.what());
  } catch (...) {
    return fail("internal error: uncaught exception of an unknown type");
  }
}

}  // namespace rdmaps::tools
