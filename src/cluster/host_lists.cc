#include "src/cluster/host_lists.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "src/base/host_port.h"

namespace rdmaps::internal {

std::string Quote(std::string_view s) {
  constexpr std::size_t kMax = 200;
  std::string out = "'";
  out += s.size() > kMax ? std::string(s.substr(0, kMax)) + "..." : std::string(s);
  out += "'";
  return out;
}

std::string LocalHostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

Result<std::vector<std::string>> ParseHostList(std::string_view text, std::string_view what) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    auto entry = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    // Tolerate surrounding spaces: "a:1, b:2".
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    if (entry.empty()) {
      return InvalidArgumentError(std::string(what) + ": " + Quote(text) +
                                  " has an empty entry; expected host:port,host:port");
    }
    RDMAPS_ASSIGN_OR_RETURN(auto hp, ParseHostPort(entry, what));
    out.push_back(std::string(entry));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<int> ParseCount(std::string_view name, std::string_view text) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    return InvalidArgumentError(std::string(name) + "=" + Quote(text) +
                                " is not a non-negative integer");
  }
  return v;
}

namespace {

// How many names `name` expands to, at most kMaxSlurmNodes + 1 (the
// product of its groups' sizes; an item that is not N or N-M counts 1 and is
// refused by ExpandOne). Checked before expanding: the groups multiply, and
// building each of a huge product's names before the leaf count stops it
// costs seconds.
std::uint64_t CountNames(std::string_view name) {
  std::uint64_t total = 1;
  std::size_t at = 0;
  while (true) {
    auto open = name.find('[', at);
    if (open == std::string_view::npos) break;
    auto close = name.find(']', open);
    if (close == std::string_view::npos) break;
    std::string_view body = name.substr(open + 1, close - open - 1);
    std::uint64_t group = 0;
    std::size_t start = 0;
    while (true) {
      auto comma = body.find(',', start);
      auto item = body.substr(
          start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      auto dash = item.find('-');
      std::uint64_t lo = 0, hi = 0;
      std::string_view lo_s = item.substr(0, dash);
      std::string_view hi_s = dash == std::string_view::npos ? lo_s : item.substr(dash + 1);
      const bool ok =
          lo_s.size() <= 9 && hi_s.size() <= 9 &&
          std::from_chars(lo_s.data(), lo_s.data() + lo_s.size(), lo).ec == std::errc() &&
          std::from_chars(hi_s.data(), hi_s.data() + hi_s.size(), hi).ec == std::errc() && hi >= lo;
      group += ok ? hi - lo + 1 : 1;  // <= 10^9 per item; bounded below
      if (group > kMaxSlurmNodes) return kMaxSlurmNodes + 1;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    total *= std::max<std::uint64_t>(group, 1);  // both <= kMaxSlurmNodes + 1: no overflow
    if (total > kMaxSlurmNodes) return kMaxSlurmNodes + 1;
    at = close + 1;
  }
  return total;
}

// Expands one name that may hold bracket groups, appending to `out`.
Status ExpandOne(std::string_view whole, std::string_view name, std::vector<std::string>* out) {
  auto open = name.find('[');
  if (open == std::string_view::npos) {
    if (name.find(']') != std::string_view::npos) {
      return InvalidArgumentError("Slurm node list " + Quote(whole) + ": unmatched ']' in " +
                                  Quote(name));
    }
    // Bracket groups multiply ("a[0-99999]b[0-99999]"): bound the total.
    if (out->size() >= kMaxSlurmNodes) {
      return InvalidArgumentError("Slurm node list " + Quote(whole) + " expands to more than " +
                                  std::to_string(kMaxSlurmNodes) + " nodes");
    }
    out->push_back(std::string(name));
    return Status::OK();
  }
  auto close = name.find(']', open);
  if (close == std::string_view::npos) {
    return InvalidArgumentError("Slurm node list " + Quote(whole) + ": unmatched '[' in " +
                                Quote(name));
  }
  std::string_view prefix = name.substr(0, open);
  std::string_view body = name.substr(open + 1, close - open - 1);
  std::string_view rest = name.substr(close + 1);
  if (body.empty()) {
    return InvalidArgumentError("Slurm node list " + Quote(whole) + ": empty brackets in " +
                                Quote(name));
  }
  std::size_t start = 0;
  while (true) {
    auto comma = body.find(',', start);
    auto item = body.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto dash = item.find('-');
    std::string_view lo_s = item.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : item.substr(dash + 1);
    auto digits = [](std::string_view s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(lo_s) || !digits(hi_s)) {
      return InvalidArgumentError("Slurm node list " + Quote(whole) + ": range " + Quote(item) +
                                  " is not N or N-M with decimal N, M");
    }
    int lo = 0, hi = 0;
    std::from_chars(lo_s.data(), lo_s.data() + lo_s.size(), lo);
    std::from_chars(hi_s.data(), hi_s.data() + hi_s.size(), hi);
    if (hi < lo) {
      return InvalidArgumentError("Slurm node list " + Quote(whole) + ": range " + Quote(item) +
                                  " runs backwards");
    }
    if (hi - lo > 100000) {
      return InvalidArgumentError("Slurm node list " + Quote(whole) + ": range " + Quote(item) +
                                  " is implausibly large");
    }
    // Zero padding is the width of the lower bound when it has a leading 0.
    std::size_t width = lo_s.size() > 1 && lo_s[0] == '0' ? lo_s.size() : 0;
    for (int v = lo; v <= hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      std::string expanded = std::string(prefix) + num + std::string(rest);
      RDMAPS_RETURN_IF_ERROR(ExpandOne(whole, expanded, out));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<std::string>> ExpandSlurmNodeList(std::string_view text) {
  std::vector<std::string> out;
  if (text.empty()) {
    return InvalidArgumentError("Slurm node list is empty; is SLURM_JOB_NODELIST set?");
  }
  // Split at commas outside brackets.
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '[') ++depth;
    if (i < text.size() && text[i] == ']') --depth;
    if (depth < 0 || depth > 1) {
      return InvalidArgumentError("Slurm node list " + Quote(text) + ": unbalanced brackets");
    }
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      auto name = text.substr(start, i - start);
      if (name.empty()) {
        return InvalidArgumentError("Slurm node list " + Quote(text) + " has an empty name");
      }
      if (out.size() + CountNames(name) > kMaxSlurmNodes) {
        return InvalidArgumentError("Slurm node list " + Quote(text) + " expands to more than " +
                                    std::to_string(kMaxSlurmNodes) + " nodes");
      }
      RDMAPS_RETURN_IF_ERROR(ExpandOne(text, name, &out));
      start = i + 1;
    }
  }
  if (depth != 0) {
    return InvalidArgumentError("Slurm node list " + Quote(text) + ": unbalanced brackets");
  }
  return out;
}

}  // namespace rdmaps::internal
