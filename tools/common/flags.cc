#include "tools/common/flags.h"

#include <gflags/gflags.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>
#include <vector>

#include "tools/common/exit.h"

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

// Exits kExitConfig (2) quoting the flag unless `value` is a valid value of
// the numeric flag `flag`: gflags would exit 1 for a malformed one, accepts
// inf and nan for doubles, and the tools need finite numbers.
void CheckNumericValue(const char* program, const gflags::CommandLineFlagInfo& flag,
                       const std::string& value) {
  const char* b = value.data();
  const char* e = value.data() + value.size();
  bool ok = false;
  const auto whole = [&](auto parsed) { return parsed.ec == std::errc() && parsed.ptr == e; };
  // gflags reads integers as decimal, or hexadecimal after 0x.
  int base = 10;
  if (flag.type != "double" && value.size() > 2 && value[0] == '0' &&
      (value[1] == 'x' || value[1] == 'X')) {
    base = 16;
    b += 2;
  }
  std::string limits;
  if (flag.type == "int32") {
    std::int32_t v;
    ok = whole(std::from_chars(b, e, v, base));
    limits = "an integer in -2147483648..2147483647";
  } else if (flag.type == "uint32") {
    std::uint32_t v;
    ok = whole(std::from_chars(b, e, v, base));
    limits = "an integer in 0..4294967295";
  } else if (flag.type == "int64") {
    std::int64_t v;
    ok = whole(std::from_chars(b, e, v, base));
    limits = "a 64-bit integer";
  } else if (flag.type == "uint64") {
    std::uint64_t v;
    ok = whole(std::from_chars(b, e, v, base));
    limits = "an integer in 0..18446744073709551615";
  } else if (flag.type == "double") {
    double v = 0;
    ok = whole(std::from_chars(b, e, v)) && std::isfinite(v);
    limits = "a finite number";
  } else {
    return;
  }
  if (ok) return;
  std::fprintf(stderr, "%s: --%s='%s' is not %s\n", program, flag.name.c_str(),
               value.substr(0, 200).c_str(), limits.c_str());
  std::exit(kExitConfig);
}

// The flags of the command line, checked before gflags parses them
// ("--name=value", "-name=value" and "--name value"): unknown names and
// numeric values that do not fit exit kExitConfig, where gflags would exit
// 1 (or, for inf and nan, accept them).
void CheckFlags(int argc, char** argv) {
  std::string program = argc > 0 ? argv[0] : "rdmaps";
  program = program.substr(program.find_last_of('/') + 1);
  bool undefok = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).find("undefok") != std::string::npos) undefok = true;
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.erase(0, arg[1] == '-' ? 2 : 1);
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      const bool negated_bool = name.starts_with("no") &&
                                gflags::GetCommandLineFlagInfo(name.c_str() + 2, &info) &&
                                info.type == "bool";
      if (!negated_bool && !undefok) {
        std::fprintf(stderr, "%s: unknown flag '%s'; see %s --helpshort\n", program.c_str(),
                     argv[i], program.c_str());
        std::exit(kExitConfig);
      }
      continue;
    }
    if (info.type == "bool" || info.type == "string") continue;
    if (eq != std::string::npos) {
      CheckNumericValue(program.c_str(), info, arg.substr(eq + 1));
    } else if (i + 1 < argc) {
      CheckNumericValue(program.c_str(), info, argv[++i]);
    }
  }
}

}  // namespace

void ParseCommandLineFlags(int* argc, char*** argv) {
  CheckFlags(*argc, *argv);
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
  if (FlagIsTrue("help") || FlagIsTrue("helpfull")) ShowHelp(/*with_library_flags=*/true);
  if (FlagIsTrue("helpshort")) ShowHelp(/*with_library_flags=*/false);
  gflags::HandleCommandLineHelpFlags();
}

}  // namespace rdmaps::tools
