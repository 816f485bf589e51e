#include "tools/common/flags.h"

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace rdmaps::tools {
namespace {

bool FlagIsTrue(const char* name) {
  std::string value;
  return gflags::GetCommandLineOption(name, &value) && value == "true";
}

std::string Dirname(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// The folders of the files that define gflags' and glog's own flags.
std::vector<std::string> LibraryDirs() {
  std::vector<std::string> dirs;
  for (const char* name : {"help", "logtostderr"}) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name, &info)) dirs.push_back(Dirname(info.filename));
  }
  return dirs;
}

bool IsLibraryFlag(const gflags::CommandLineFlagInfo& flag, const std::vector<std::string>& dirs) {
  const std::string dir = Dirname(flag.filename);
  for (const auto& d : dirs) {
    if (dir == d) return true;
  }
  return false;
}

// gflags' --help format: a "Flags from FILE:" heading per file, two blank
// lines between folders, each flag as gflags::DescribeOneFlag puts it.
void PrintFlags(const std::vector<gflags::CommandLineFlagInfo>& flags, std::string* last_file) {
  for (const auto& flag : flags) {
    if (flag.filename != *last_file) {
      if (!last_file->empty() && Dirname(flag.filename) != Dirname(*last_file)) {
        std::fputs("\n\n", stdout);
      }
      std::printf("\n  Flags from %s:\n", flag.filename.c_str());
      *last_file = flag.filename;
    }
    std::fputs(gflags::DescribeOneFlag(flag).c_str(), stdout);
  }
}

[[noreturn]] void ShowHelp(bool with_library_flags) {
  std::printf("%s: %s\n", gflags::ProgramInvocationShortName(), gflags::ProgramUsage());
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);  // sorted by file, then name
  const std::vector<std::string> dirs = LibraryDirs();
  std::vector<gflags::CommandLineFlagInfo> own, library;
  for (auto& flag : all) (IsLibraryFlag(flag, dirs) ? library : own).push_back(std::move(flag));
  std::string last_file;
  PrintFlags(own, &last_file);
  if (with_library_flags) PrintFlags(library, &last_file);
  std::fflush(stdout);
  std::exit(1);
}

}  // namespace

void ParseCommandLineFlags(int* argc, char*** argv) {
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
  if (FlagIsTrue("help") || FlagIsTrue("helpfull")) ShowHelp(/*with_library_flags=*/true);
  if (FlagIsTrue("helpshort")) ShowHelp(/*with_library_flags=*/false);
  gflags::HandleCommandLineHelpFlags();
}

}  // namespace rdmaps::tools
