// The job's table list as JSON (see include/rdmaps/cluster.h for the format).
#include "rdmaps/tables_json.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "rdmaps/cluster.h"
#include "src/base/checked.h"
#include "src/cluster/json_parse.h"
#include "src/ps/table_names.h"

namespace rdmaps {

namespace {

using nlohmann::json;

std::string Quote(const json& j) {
  std::string s = j.dump();
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return "'" + s + "'";
}

Status CheckKeys(const json& obj, const std::set<std::string>& allowed, const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!allowed.count(it.key())) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return InvalidArgumentError("tables: unknown key \"" + it.key() + "\" in " + where +
                                  " (allowed: " + list + ")");
    }
  }
  return Status::OK();
}

template <typename T>
Status Get(const json& obj, const char* key, const std::string& where, T* out) {
  if (!obj.contains(key)) return Status::OK();
  const json& v = obj.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) {
      return InvalidArgumentError("tables: " + where + " \"" + key + "\" must be a string, got " +
                                  Quote(v));
    }
    *out = v.get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    static_assert(std::is_same_v<T, float>);
    if (!v.is_number()) {
      return InvalidArgumentError("tables: " + where + " \"" + key + "\" must be a number, got " +
                                  Quote(v));
    }
    // 1e39 would become inf as a float.
    RDMAPS_ASSIGN_OR_RETURN(*out, internal::CheckedFiniteFloat(
                                      v.get<double>(), "tables: " + where + " \"" + key + "\""));
  } else {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0)) {
      return InvalidArgumentError("tables: " + where + " \"" + key +
                                  "\" must be a non-negative integer, got " + Quote(v));
    }
    // Refused, not truncated, when it does not fit (dim 2^32+1 is not 1).
    RDMAPS_ASSIGN_OR_RETURN(*out,
                            internal::CheckedNarrow<T>(v.get<std::uint64_t>(),
                                                       "tables: " + where + " \"" + key + "\""));
  }
  return Status::OK();
}

Status ParseInit(const json& j, const std::string& where, Initializer* init) {
  if (!j.is_object()) return InvalidArgumentError("tables: " + where + " must be an object");
  RDMAPS_RETURN_IF_ERROR(
      CheckKeys(j, {"kind", "value", "low", "high", "mean", "stddev", "seed"}, where));
  std::string kind = InitializerKindName(init->kind);
  RDMAPS_RETURN_IF_ERROR(Get(j, "kind", where, &kind));
  Result<Initializer::Kind> k = ParseInitializerKind(kind);
  if (!k.ok()) {
    return InvalidArgumentError("tables: " + where + " kind '" + kind + "' is not " +
                                internal::NameList(internal::kInitializerKindNames));
  }
  init->kind = *k;
  RDMAPS_RETURN_IF_ERROR(Get(j, "value", where, &init->value));
  RDMAPS_RETURN_IF_ERROR(Get(j, "low", where, &init->low));
  RDMAPS_RETURN_IF_ERROR(Get(j, "high", where, &init->high));
  RDMAPS_RETURN_IF_ERROR(Get(j, "mean", where, &init->mean));
  RDMAPS_RETURN_IF_ERROR(Get(j, "stddev", where, &init->stddev));
  RDMAPS_RETURN_IF_ERROR(Get(j, "seed", where, &init->seed));
  return Status::OK();
}

Status ParseOptimizer(const json& j, const std::string& where, OptimizerOptions* opt) {
  if (!j.is_object()) return InvalidArgumentError("tables: " + where + " must be an object");
  RDMAPS_RETURN_IF_ERROR(CheckKeys(
      j, {"kind", "learning_rate", "momentum", "initial_accumulator", "beta1", "beta2", "epsilon"},
      where));
  std::string kind = OptimizerKindName(opt->kind);
  RDMAPS_RETURN_IF_ERROR(Get(j, "kind", where, &kind));
  Result<OptimizerOptions::Kind> k = ParseOptimizerKind(kind);
  if (!k.ok()) {
    return InvalidArgumentError("tables: " + where + " kind '" + kind + "' is not " +
                                internal::NameList(internal::kOptimizerKindNames));
  }
  opt->kind = *k;
  RDMAPS_RETURN_IF_ERROR(Get(j, "learning_rate", where, &opt->learning_rate));
  RDMAPS_RETURN_IF_ERROR(Get(j, "momentum", where, &opt->momentum));
  RDMAPS_RETURN_IF_ERROR(Get(j, "initial_accumulator", where, &opt->initial_accumulator));
  RDMAPS_RETURN_IF_ERROR(Get(j, "beta1", where, &opt->beta1));
  RDMAPS_RETURN_IF_ERROR(Get(j, "beta2", where, &opt->beta2));
  RDMAPS_RETURN_IF_ERROR(Get(j, "epsilon", where, &opt->epsilon));
  return Status::OK();
}

// At most 10 years: more is a typo, and the milliseconds of it fit anywhere.
constexpr std::uint64_t kMaxSeconds = 10ull * 366 * 24 * 3600;
constexpr std::size_t kMaxDirBytes = 4096;

Status ParseCheckpoint(const json& j, CheckpointSettings* out) {
  const std::string where = "\"checkpoint\"";
  if (!j.is_object()) {
    return InvalidArgumentError("tables: " + where + " must be an object, got " + Quote(j));
  }
  RDMAPS_RETURN_IF_ERROR(
      CheckKeys(j, {"dir", "every_clocks", "every_seconds", "keep", "timeout_seconds"}, where));
  CheckpointSettings c;
  if (j.contains("dir")) {
    std::string dir;
    RDMAPS_RETURN_IF_ERROR(Get(j, "dir", where, &dir));
    if (dir.empty() || dir.size() > kMaxDirBytes || dir.find('\0') != std::string::npos) {
      return InvalidArgumentError("tables: " + where +
                                  " \"dir\" must be a folder path of 1 to 4096 bytes");
    }
    c.dir = dir;
  }
  auto number = [&](const char* key, std::uint64_t max, std::optional<std::uint64_t>* v) -> Status {
    if (!j.contains(key)) return Status::OK();
    std::uint64_t x = 0;
    RDMAPS_RETURN_IF_ERROR(Get(j, key, where, &x));
    if (x > max) {
      return InvalidArgumentError("tables: " + where + " \"" + key + "\" " + std::to_string(x) +
                                  " is more than " + std::to_string(max));
    }
    *v = x;
    return Status::OK();
  };
  RDMAPS_RETURN_IF_ERROR(number("every_clocks", ~0ull, &c.every_clocks));
  RDMAPS_RETURN_IF_ERROR(number("every_seconds", kMaxSeconds, &c.every_seconds));
  RDMAPS_RETURN_IF_ERROR(number("timeout_seconds", kMaxSeconds, &c.timeout_seconds));
  if (j.contains("keep")) {
    std::uint32_t keep = 0;
    RDMAPS_RETURN_IF_ERROR(Get(j, "keep", where, &keep));
    c.keep = keep;
  }
  *out = std::move(c);
  return Status::OK();
}

// The top-level object's "checkpoint" (none: all unset).
Result<CheckpointSettings> CheckpointOf(const json& j) {
  CheckpointSettings c;
  if (j.is_object() && j.contains("checkpoint")) {
    RDMAPS_RETURN_IF_ERROR(ParseCheckpoint(j.at("checkpoint"), &c));
  }
  return c;
}

}  // namespace

void CheckpointSettings::ApplyTo(ServerOptions* o) const {
  if (dir) o->checkpoint_dir = *dir;
  if (every_clocks) o->checkpoint_every = *every_clocks;
  if (every_seconds) o->checkpoint_interval = std::chrono::seconds(*every_seconds);
  if (keep) o->checkpoint_keep = *keep;
  if (timeout_seconds) o->checkpoint_timeout = std::chrono::seconds(*timeout_seconds);
}

Result<CheckpointSettings> ParseCheckpointSettings(std::string_view text) {
  RDMAPS_ASSIGN_OR_RETURN(json j, internal::ParseJsonLimited(text, "tables"));
  if (j.is_object())
    RDMAPS_RETURN_IF_ERROR(CheckKeys(j, {"tables", "checkpoint"}, "the top level"));
  return CheckpointOf(j);
}

Result<CheckpointSettings> ReadCheckpointSettingsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("tables: cannot open '" + path + "'; check --tables");
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = ParseCheckpointSettings(ss.str());
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

Result<std::vector<TableOptions>> ParseTablesJson(std::string_view text) {
  RDMAPS_ASSIGN_OR_RETURN(json j, internal::ParseJsonLimited(text, "tables"));
  if (j.is_object()) {
    RDMAPS_RETURN_IF_ERROR(CheckKeys(j, {"tables", "checkpoint"}, "the top level"));
    RDMAPS_RETURN_IF_ERROR(CheckpointOf(j).status());
    if (!j.contains("tables")) {
      return InvalidArgumentError("tables: expected {\"tables\": [...]}, got " + Quote(j));
    }
    j = j.at("tables");
  }
  if (!j.is_array()) return InvalidArgumentError("tables: expected a list, got " + Quote(j));
  std::vector<TableOptions> out;
  std::set<std::uint32_t> ids;
  std::set<std::string> names;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    std::string where = "table #" + std::to_string(i);
    if (!t.is_object()) return InvalidArgumentError("tables: " + where + " is " + Quote(t));
    RDMAPS_RETURN_IF_ERROR(CheckKeys(
        t, {"id", "name", "rows", "dim", "init", "optimizer", "staleness", "layout"}, where));
    TableOptions o;
    o.id = static_cast<std::uint32_t>(i);
    RDMAPS_RETURN_IF_ERROR(Get(t, "id", where, &o.id));
    RDMAPS_RETURN_IF_ERROR(Get(t, "name", where, &o.name));
    if (o.name.empty()) o.name = "t" + std::to_string(o.id);
    where += " ('" + o.name + "')";
    RDMAPS_RETURN_IF_ERROR(Get(t, "rows", where, &o.rows));
    RDMAPS_RETURN_IF_ERROR(Get(t, "dim", where, &o.dim));
    if (o.rows < 1 || o.dim < 1) {
      return InvalidArgumentError("tables: " + where + " needs rows >= 1 and dim >= 1");
    }
    if (t.contains("init"))
      RDMAPS_RETURN_IF_ERROR(ParseInit(t.at("init"), where + " init", &o.init));
    if (t.contains("optimizer")) {
      RDMAPS_RETURN_IF_ERROR(ParseOptimizer(t.at("optimizer"), where + " optimizer", &o.optimizer));
    }
    if (t.contains("staleness")) {
      const json& s = t.at("staleness");
      if (s.is_string() && s.get<std::string>() == "asp") {
        o.staleness = kAsp;
      } else if (s.is_string() && s.get<std::string>() == "bsp") {
        o.staleness = kBsp;
      } else if (s.is_number_unsigned()) {
        // Staleness 2^32 is not 0 (BSP): refused.
        RDMAPS_ASSIGN_OR_RETURN(o.staleness,
                                internal::CheckedNarrow<std::uint32_t>(
                                    s.get<std::uint64_t>(), "tables: " + where + " \"staleness\""));
      } else {
        return InvalidArgumentError("tables: " + where + " staleness " + Quote(s) +
                                    " is not \"bsp\", \"asp\" or a non-negative integer");
      }
    }
    if (t.contains("layout")) {
      const json& l = t.at("layout");
      const Result<RowLayout> layout =
          ParseRowLayout(l.is_string() ? l.get<std::string>() : std::string());
      if (!layout.ok()) {
        return InvalidArgumentError("tables: " + where + " layout " + Quote(l) + " is not " +
                                    internal::NameList(internal::kRowLayoutNames, "\""));
      }
      o.layout = *layout;
    }
    if (!ids.insert(o.id).second) {
      return InvalidArgumentError("tables: " + where + " repeats id " + std::to_string(o.id));
    }
    if (!names.insert(o.name).second) {
      return InvalidArgumentError("tables: " + where + " repeats name '" + o.name + "'");
    }
    out.push_back(std::move(o));
  }
  return out;
}

std::string TablesToJson(const std::vector<TableOptions>& tables) {
  json list = json::array();
  for (const auto& t : tables) {
    json init = {{"kind", InitializerKindName(t.init.kind)}, {"seed", t.init.seed}};
    switch (t.init.kind) {
      case Initializer::Kind::kZeros:
        break;
      case Initializer::Kind::kConstant:
        init["value"] = t.init.value;
        break;
      case Initializer::Kind::kUniform:
        init["low"] = t.init.low;
        init["high"] = t.init.high;
        break;
      case Initializer::Kind::kNormal:
        init["mean"] = t.init.mean;
        init["stddev"] = t.init.stddev;
        break;
    }
    const auto& o = t.optimizer;
    json opt = {{"kind", OptimizerKindName(o.kind)},
                {"learning_rate", o.learning_rate},
                {"momentum", o.momentum},
                {"initial_accumulator", o.initial_accumulator},
                {"beta1", o.beta1},
                {"beta2", o.beta2},
                {"epsilon", o.epsilon}};
    json staleness = t.staleness == kAsp ? json("asp") : json(t.staleness);
    list.push_back({{"id", t.id},
                    {"name", t.name},
                    {"rows", t.rows},
                    {"dim", t.dim},
                    {"init", init},
                    {"optimizer", opt},
                    {"staleness", staleness},
                    {"layout", RowLayoutName(t.layout)}});
  }
  return json({{"tables", list}}).dump(2) + "\n";
}

Result<std::vector<TableOptions>> ReadTablesFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("tables: cannot open '" + path + "'; check --tables");
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = ParseTablesJson(ss.str());
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

Result<bool> DescribeTablesIfAsked(const std::vector<TableOptions>& tables,
                                   const Environment& env) {
  auto it = env.find(kDescribeTablesEnv);
  if (it == env.end() || it->second.empty()) return false;
  std::ofstream out(it->second, std::ios::trunc);
  out << TablesToJson(tables);
  out.close();
  if (!out) {
    return Status(StatusCode::kIOError, std::string("cannot write the table list to ") +
                                            kDescribeTablesEnv + "=" + it->second);
  }
  return true;
}

}  // namespace rdmaps
