#include "src/ps/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "src/base/fd.h"
#include "src/base/log.h"
#include "src/ps/table_names.h"

namespace rdmaps::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kFormatName[] = "rdmaps-checkpoint";
constexpr std::size_t kIoChunk = 4 << 20;
// More parts than this in a folder name is damage, not a job.
constexpr std::uint32_t kMaxParts = 1 << 16;

std::string PartName(std::uint32_t i, std::uint32_t n) {
  return "part-" + std::to_string(i) + "-of-" + std::to_string(n);
}

std::string Hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening " + path + " to fsync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync of " + path, err);
  return Status::OK();
}

// mkdir -p of one level; fsyncs the parent when it made it.
Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    return FsyncPath(fs::path(path).parent_path().string());
  }
  if (errno == EEXIST) return Status::OK();
  return ErrnoError("creating folder " + path + " (check that the checkpoint dir is writable)",
                    errno);
}

// The .npy header (format 1.0) of an array of `shape` and `dtype`, padded so
// that the data starts at a multiple of 64 bytes.
std::string NpyHeader(const std::string& dtype, const std::vector<std::uint64_t>& shape) {
  std::string dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  const std::size_t unpadded = 10 + dict.size() + 1;
  dict.append(RoundUp(unpadded, 64) - unpadded, ' ');
  dict += '\n';
  std::string h("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(dict.size());
  h += static_cast<char>(len & 0xff);
  h += static_cast<char>(len >> 8);
  return h + dict;
}

// Writes a file of `header` then the `columns` columns from `offset` of each
// of `rows` rows of `stride` floats at `src` (a dense copy when offset 0 and
// columns == stride), fsyncs it, and fills the manifest entry.
Status WriteNpy(const std::string& path, const std::string& header, const float* src,
                std::uint64_t rows, std::size_t stride, std::size_t offset, std::size_t columns,
                CheckpointFile* entry) {
  const int raw = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0) return ErrnoError("creating " + path, errno);
  Fd fd(raw);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::uint64_t total = 0;
  auto put = [&](const void* p, std::size_t n) -> Status {
    XXH3_64bits_update(st, p, n);
    total += n;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd.get(), c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("writing " + path + " (disk full?)", errno);
      }
      c += w;
      n -= static_cast<std::size_t>(w);
    }
    return Status::OK();
  };
  Status s = put(header.data(), header.size());
  if (s.ok()) {
    if (offset == 0 && columns == stride) {
      const std::size_t bytes = rows * stride * sizeof(float);
      for (std::size_t at = 0; at < bytes && s.ok(); at += kIoChunk) {
        s = put(reinterpret_cast<const char*>(src) + at, std::min(kIoChunk, bytes - at));
      }
    } else {
      std::vector<float> buf;
      const std::uint64_t per = std::max<std::uint64_t>(1, kIoChunk / (columns * sizeof(float)));
      for (std::uint64_t r0 = 0; r0 < rows && s.ok(); r0 += per) {
        const std::uint64_t r1 = std::min(rows, r0 + per);
        buf.resize((r1 - r0) * columns);
        for (std::uint64_t r = r0; r < r1; ++r) {
          std::memcpy(buf.data() + (r - r0) * columns, src + r * stride + offset,
                      columns * sizeof(float));
        }
        s = put(buf.data(), buf.size() * sizeof(float));
      }
    }
  }
  entry->xxh3 = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  entry->bytes = total;
  RDMAPS_RETURN_IF_ERROR(s);
  if (::fsync(fd.get()) != 0) return ErrnoError("fsync of " + path, errno);
  return Status::OK();
}

json FileJson(const CheckpointFile& f) {
  return {{"tensor", f.tensor}, {"file", f.file},   {"shape", f.shape},
          {"dtype", f.dtype},   {"bytes", f.bytes}, {"xxh3", Hex(f.xxh3)}};
}

Status WriteText(const std::string& path, const std::string& text) {
  const int raw = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0) return ErrnoError("creating " + path, errno);
  Fd fd(raw);
  std::size_t at = 0;
  while (at < text.size()) {
    const ssize_t w = ::write(fd.get(), text.data() + at, text.size() - at);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing " + path, errno);
    }
    at += static_cast<std::size_t>(w);
  }
  if (::fsync(fd.get()) != 0) return ErrnoError("fsync of " + path, errno);
  return Status::OK();
}

Result<std::string> ReadText(const std::string& path, std::size_t max_bytes) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoError("opening " + path, errno);
  Fd fd(raw);
  std::string out;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading " + path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      return DataLossError(path + " is larger than " + std::to_string(max_bytes) +
                           " bytes: not a checkpoint manifest");
    }
  }
  return out;
}

// Clock of a "ckpt-<digits>" name, or nullopt.
std::optional<std::uint64_t> ClockOfName(const std::string& name) {
  if (name.size() != 25 || name.compare(0, 5, "ckpt-") != 0) return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(name[i] - '0');
    if (v > (~0ull - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// The clocks of the ckpt-* folders under dir, ascending.
std::vector<std::uint64_t> ListCheckpoints(const std::string& dir) {
  std::vector<std::uint64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (auto c = ClockOfName(e.path().filename().string())) out.push_back(*c);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void UpdateLatest(const std::string& dir, const ShardSnapshot& snap) {
  const std::string latest = dir + "/latest";
  auto cur = ReadText(latest, 4096);
  if (cur.ok()) {
    std::string name = *cur;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    auto c = ClockOfName(name);
    if (c && *c >= snap.clock) return;
  }
  const std::string tmp =
      dir + "/.latest.tmp-" + std::to_string(snap.server_index) + "-" + std::to_string(::getpid());
  Status s = WriteText(tmp, CheckpointName(snap.clock) + "\n");
  if (s.ok() && ::rename(tmp.c_str(), latest.c_str()) != 0) s = ErrnoError("rename", errno);
  if (s.ok()) s = FsyncPath(dir);
  if (!s.ok()) RDMAPS_LOG(WARNING) << "checkpoint: updating " << latest << ": " << s;
}

// All but the newest `keep` complete checkpoints go, and every
// folder older than the oldest one kept (incomplete ones included).
void Prune(const std::string& dir, std::uint32_t keep) {
  std::vector<std::uint64_t> clocks = ListCheckpoints(dir);
  std::vector<std::uint64_t> complete;
  for (std::uint64_t c : clocks) {
    if (OpenCheckpoint(dir + "/" + CheckpointName(c)).ok()) complete.push_back(c);
  }
  if (complete.size() <= keep) return;
  const std::uint64_t oldest_kept = complete[complete.size() - keep];
  for (std::uint64_t c : clocks) {
    if (c >= oldest_kept) break;
    std::error_code ec;
    fs::remove_all(dir + "/" + CheckpointName(c), ec);
    if (ec)
      RDMAPS_LOG(WARNING) << "checkpoint: removing " << CheckpointName(c) << ": " << ec.message();
  }
}

// Fields of a manifest, with errors as Status (nlohmann throws).
template <typename T>
Status Field(const json& j, const char* key, const std::string& where, T* out) {
  if (!j.is_object() || !j.contains(key)) {
    return DataLossError(where + ": manifest has no \"" + key + "\"");
  }
  try {
    *out = j.at(key).get<T>();
  } catch (const json::exception& e) {
    return DataLossError(where + ": manifest field \"" + key + "\" has the wrong type");
  }
  return Status::OK();
}

Result<CheckpointPart> ReadPart(const std::string& part_dir) {
  const std::string mpath = part_dir + "/manifest.json";
  RDMAPS_ASSIGN_OR_RETURN(std::string text, ReadText(mpath, 64 << 20));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(mpath + " is not valid JSON (damaged?); restore another checkpoint");
  }
  CheckpointPart p;
  p.path = part_dir;
  std::string format;
  RDMAPS_RETURN_IF_ERROR(Field(j, "format", mpath, &format));
  if (format != kFormatName) return DataLossError(mpath + " is not an rdmaps checkpoint manifest");
  RDMAPS_RETURN_IF_ERROR(Field(j, "format_version", mpath, &p.format_version));
  if (p.format_version > kCheckpointFormatVersion) {
    return FailedPreconditionError(
        mpath + " is of checkpoint format " + std::to_string(p.format_version) +
        ", newer than this build reads (" + std::to_string(kCheckpointFormatVersion) +
        "); restore it with a newer rdmaps");
  }
  RDMAPS_RETURN_IF_ERROR(Field(j, "clock", mpath, &p.clock));
  RDMAPS_RETURN_IF_ERROR(Field(j, "lineage", mpath, &p.lineage));
  RDMAPS_RETURN_IF_ERROR(Field(j, "server_index", mpath, &p.server_index));
  RDMAPS_RETURN_IF_ERROR(Field(j, "num_servers", mpath, &p.num_servers));
  if (!j.contains("tables") || !j["tables"].is_array()) {
    return DataLossError(mpath + ": manifest has no table list");
  }
  for (const json& jt : j["tables"]) {
    CheckpointTable t;
    RDMAPS_RETURN_IF_ERROR(Field(jt, "id", mpath, &t.id));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "name", mpath, &t.name));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "rows", mpath, &t.rows));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "dim", mpath, &t.dim));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "optimizer", mpath, &t.optimizer));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "shard_begin", mpath, &t.shard_begin));
    RDMAPS_RETURN_IF_ERROR(Field(jt, "shard_rows", mpath, &t.shard_rows));
    if (!jt.contains("files") || !jt["files"].is_array()) {
      return DataLossError(mpath + ": table " + t.name + " has no file list");
    }
    for (const json& jf : jt["files"]) {
      CheckpointFile f;
      std::string hex;
      RDMAPS_RETURN_IF_ERROR(Field(jf, "tensor", mpath, &f.tensor));
      RDMAPS_RETURN_IF_ERROR(Field(jf, "file", mpath, &f.file));
      RDMAPS_RETURN_IF_ERROR(Field(jf, "shape", mpath, &f.shape));
      RDMAPS_RETURN_IF_ERROR(Field(jf, "dtype", mpath, &f.dtype));
      RDMAPS_RETURN_IF_ERROR(Field(jf, "bytes", mpath, &f.bytes));
      RDMAPS_RETURN_IF_ERROR(Field(jf, "xxh3", mpath, &hex));
      if (f.file.empty() || f.file.find('/') != std::string::npos || f.file[0] == '.' ||
          hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return DataLossError(mpath + ": a file entry of table " + t.name + " is malformed");
      }
      f.xxh3 = std::stoull(hex, nullptr, 16);
      t.files.push_back(std::move(f));
    }
    p.tables.push_back(std::move(t));
  }
  return p;
}

// A file of a part opened for reading, its .npy header checked against the
// manifest entry: rows of `columns` elements of 4 bytes follow.
struct NpyReader {
  Fd fd;
  std::string path;
  std::uint64_t data_offset = 0;
};

Result<NpyReader> OpenNpy(const std::string& part_dir, const CheckpointFile& f, std::uint64_t rows,
                          std::size_t columns, const std::string& dtype) {
  NpyReader r;
  r.path = part_dir + "/" + f.file;
  const int raw = ::open(r.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoError("opening " + r.path, errno);
  r.fd = Fd(raw);
  std::vector<std::uint64_t> shape{rows};
  if (columns != 1 || dtype == "<f4") shape.push_back(columns);
  if (f.dtype != dtype || f.shape != shape) {
    return DataLossError(r.path + ": the manifest gives dtype " + f.dtype +
                         " and a shape other than the table's; the checkpoint is damaged");
  }
  const std::string header = NpyHeader(dtype, shape);
  if (f.bytes != header.size() + rows * columns * 4) {
    return DataLossError(r.path + ": the manifest gives " + std::to_string(f.bytes) +
                         " bytes, not what its shape takes; the checkpoint is damaged");
  }
  std::string got(header.size(), '\0');
  if (::pread(r.fd.get(), got.data(), got.size(), 0) != static_cast<ssize_t>(got.size()) ||
      got != header) {
    return DataLossError(r.path +
                         ": the .npy header is not the one the manifest implies; "
                         "the checkpoint is damaged, restore another one");
  }
  r.data_offset = header.size();
  return r;
}

}  // namespace

// ---- CheckpointCut -------------------------------------------------------------

CheckpointCut::CheckpointCut(std::uint32_t num_workers, std::uint64_t every)
    : every_(every), clocks_(num_workers, 0), held_(num_workers) {}

void CheckpointCut::Insert(std::uint64_t clock) {
  const bool new_min = pending_.empty() || clock < *pending_.begin();
  if (pending_.insert(clock).second && new_min) armed_at_ = std::chrono::steady_clock::now();
}

void CheckpointCut::OnClock(std::uint32_t w, std::uint64_t clock) {
  clocks_[w] = clock;
  // The first worker to reach a multiple of `every` here: none is past it.
  if (every_ != 0 && clock % every_ == 0 && clock >= captured_plus1_) Insert(clock);
}

bool CheckpointCut::Add(std::uint64_t clock, const std::vector<std::uint64_t>& clocks) {
  if (clock + 1 <= captured_plus1_ || pending_.count(clock) != 0) return true;  // taken, or due
  for (std::uint64_t c : clocks) {
    if (c != kClockDone && c > clock) return false;
  }
  Insert(clock);
  return true;
}

bool CheckpointCut::OnRequest(std::uint32_t /*w*/, std::uint64_t clock,
                              const std::vector<std::uint64_t>& clocks) {
  // Worker w is at `clock` (checked by the caller), so it holds from now.
  return Add(clock, clocks);
}

std::uint64_t CheckpointCut::Trigger(std::uint32_t ring_slots, const std::vector<bool>& done,
                                     bool* created) {
  *created = false;
  if (!pending_.empty()) return *pending_.begin();
  std::uint64_t newest = 0, active = 0;
  bool any_active = false;
  for (std::size_t w = 0; w < clocks_.size(); ++w) {
    newest = std::max(newest, clocks_[w]);
    if (!done[w]) {
      any_active = true;
      active = std::max(active, clocks_[w]);
    }
  }
  std::uint64_t clock = newest;
  if (any_active) {
    // Saturates: a clock near 2^64 is damage, and a cut there is never
    // reached (the abandon deadline ends it). Never below a done worker's
    // clock: its part holds all it pushed, its pushes of clocks up to its
    // last, so a cut before that clock would hold pushes of clocks past it
    // (and a restore there would redo them).
    clock = std::max(newest,
                     CheckedAdd(active, std::uint64_t{ring_slots} + 2).value_or(kClockDone - 1));
  }
  if (clock + 1 <= captured_plus1_) return clock;  // every worker done, and it is taken
  Insert(clock);
  *created = true;
  return clock;
}

bool CheckpointCut::Complete(const std::vector<bool>& done) const {
  if (pending_.empty()) return false;
  const std::uint64_t c = *pending_.begin();
  for (std::size_t w = 0; w < clocks_.size(); ++w) {
    if (!done[w] && clocks_[w] != c) return false;
  }
  return true;
}

bool CheckpointCut::Overtaken(const std::vector<bool>& done) const {
  if (pending_.empty()) return false;
  const std::uint64_t c = *pending_.begin();
  for (std::size_t w = 0; w < clocks_.size(); ++w) {
    if (!done[w] && clocks_[w] > c) return true;
  }
  return false;
}

void CheckpointCut::Release(bool captured) {
  if (pending_.empty()) return;
  const std::uint64_t c = *pending_.begin();
  pending_.erase(pending_.begin());
  if (captured) captured_plus1_ = std::max(captured_plus1_, c + 1);
  armed_at_ = std::chrono::steady_clock::now();
}

void CheckpointCut::SetCaptured(std::uint64_t clock) {
  captured_plus1_ = clock + 1;
  pending_.clear();
  std::fill(clocks_.begin(), clocks_.end(), clock);
}

// ---- Capture ----------------------------------------------------------------------

void CaptureTable(const ShardView& v, TableSnapshot* out) {
  out->options = *v.options;
  out->shard = v.shard;
  out->state_floats = v.state_floats;
  const std::uint32_t dim = v.options->dim;
  const ShardGeometry& g = v.geometry;
  out->rows.resize(v.shard.count * dim);
  if (!g.inline_headers()) {
    std::memcpy(out->rows.data(), v.memory, out->rows.size() * sizeof(float));
  } else {
    for (std::uint64_t b = 0; b < g.blocks(); ++b) {
      const std::uint64_t r0 = g.first_row(b);
      std::memcpy(out->rows.data() + r0 * dim, v.memory + g.row(r0), g.block_rows(b) * g.row_bytes);
    }
  }
  out->state.assign(v.state, v.state + v.shard.count * v.state_floats);
}

std::vector<StateTensor> StateTensors(OptimizerOptions::Kind kind, std::uint32_t dim) {
  switch (kind) {
    case OptimizerOptions::Kind::kSgd:
      return {};
    case OptimizerOptions::Kind::kMomentum:
      return {{"velocity", 0, dim, false}};
    case OptimizerOptions::Kind::kAdagrad:
      return {{"accumulator", 0, dim, false}};
    case OptimizerOptions::Kind::kAdam:
      return {
          {"m", 0, dim, false}, {"v", dim, dim, false}, {"step", 2 * std::size_t{dim}, 1, true}};
  }
  return {};
}

// ---- Writing ------------------------------------------------------------------------

Result<std::string> WriteCheckpointPart(const std::string& dir, const ShardSnapshot& snap,
                                        std::uint32_t keep) {
  RDMAPS_RETURN_IF_ERROR(MakeDir(dir));
  const std::string ckpt = dir + "/" + CheckpointName(snap.clock);
  RDMAPS_RETURN_IF_ERROR(MakeDir(ckpt));
  const std::string part = PartName(snap.server_index, snap.num_servers);
  const std::string tmp = ckpt + "/." + part + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a crashed earlier attempt
  if (::mkdir(tmp.c_str(), 0755) != 0) return ErrnoError("creating folder " + tmp, errno);

  json tables = json::array();
  for (const TableSnapshot& t : snap.tables) {
    const std::uint32_t dim = t.options.dim;
    const std::string base = "table-" + std::to_string(t.options.id);
    json files = json::array();
    CheckpointFile rows{"rows", base + ".rows.npy", {t.shard.count, dim}, "<f4", 0, 0};
    RDMAPS_RETURN_IF_ERROR(WriteNpy(tmp + "/" + rows.file, NpyHeader(rows.dtype, rows.shape),
                                    t.rows.data(), t.shard.count, dim, 0, dim, &rows));
    files.push_back(FileJson(rows));
    for (const StateTensor& s : StateTensors(t.options.optimizer.kind, dim)) {
      CheckpointFile f{
          s.name, base + "." + s.name + ".npy", {t.shard.count}, s.u32 ? "<u4" : "<f4", 0, 0};
      if (!s.u32) f.shape.push_back(s.width);
      RDMAPS_RETURN_IF_ERROR(WriteNpy(tmp + "/" + f.file, NpyHeader(f.dtype, f.shape),
                                      t.state.data(), t.shard.count, t.state_floats, s.offset,
                                      s.width, &f));
      files.push_back(FileJson(f));
    }
    tables.push_back({{"id", t.options.id},
                      {"name", t.options.name},
                      {"rows", t.options.rows},
                      {"dim", dim},
                      {"optimizer", OptimizerKindName(t.options.optimizer.kind)},
                      {"learning_rate", t.options.optimizer.learning_rate},
                      {"shard_begin", t.shard.begin},
                      {"shard_rows", t.shard.count},
                      {"files", files}});
  }
  json m = {{"format", kFormatName},
            {"format_version", kCheckpointFormatVersion},
            {"clock", snap.clock},
            {"lineage", snap.lineage},
            {"server_index", snap.server_index},
            {"num_servers", snap.num_servers},
            {"num_workers", snap.num_workers},
            {"partition",
             "contiguous: server i of n holds rows [i*(rows/n) + min(i, rows%n), ...) of "
             "rows/n + (i < rows%n) rows"},
            {"parts", snap.num_servers},
            {"tables", tables}};
  RDMAPS_RETURN_IF_ERROR(WriteText(tmp + "/manifest.json", m.dump(1) + "\n"));
  RDMAPS_RETURN_IF_ERROR(FsyncPath(tmp));
  const std::string final_dir = ckpt + "/" + part;
  fs::remove_all(final_dir, ec);  // an older attempt of the same clock
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return ErrnoError("publishing " + final_dir, errno);
  }
  RDMAPS_RETURN_IF_ERROR(FsyncPath(ckpt));
  if (OpenCheckpoint(ckpt).ok()) {  // every part there, of this run
    UpdateLatest(dir, snap);
    if (keep > 0) Prune(dir, keep);  // whoever completes it; the same folders go
  }
  return ckpt;
}

// ---- Reading ------------------------------------------------------------------------

Result<std::vector<CheckpointPart>> OpenCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return NotFoundError("checkpoint " + path + " does not exist (or is not a folder)");
  }
  // n from any part's name.
  std::uint32_t n = 0;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    unsigned i = 0, k = 0;
    char tail = 0;
    if (std::sscanf(e.path().filename().c_str(), "part-%u-of-%u%c", &i, &k, &tail) == 2 && k > 0 &&
        i < k && k <= kMaxParts) {
      n = std::max<std::uint32_t>(n, k);
    }
  }
  if (n == 0) {
    return FailedPreconditionError("checkpoint " + path +
                                   " has no published part (its servers crashed while writing "
                                   "it?); restore an older checkpoint");
  }
  std::vector<CheckpointPart> parts;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string pd = path + "/" + PartName(i, n);
    struct stat st;
    if (::stat((pd + "/manifest.json").c_str(), &st) != 0) {
      return FailedPreconditionError("checkpoint " + path + " is incomplete: " + PartName(i, n) +
                                     " is missing (its server crashed before publishing it, or "
                                     "is still writing it); restore an older checkpoint");
    }
    RDMAPS_ASSIGN_OR_RETURN(CheckpointPart p, ReadPart(pd));
    if (p.server_index != i || p.num_servers != n) {
      return DataLossError(pd + "/manifest.json says it is part " + std::to_string(p.server_index) +
                           " of " + std::to_string(p.num_servers) + "; the checkpoint is damaged");
    }
    if (!parts.empty()) {
      const CheckpointPart& a = parts.front();
      if (p.lineage != a.lineage) {
        return FailedPreconditionError(
            "checkpoint " + path + " is incomplete: " + PartName(i, n) +
            " was written by another run than part 0 (lineage " + p.lineage + " vs " + a.lineage +
            ": a run rewound or restarted in the same folder took the same clock, and not every "
            "server has written its part yet); restore an older checkpoint");
      }
      bool same = p.clock == a.clock && p.tables.size() == a.tables.size();
      for (std::size_t t = 0; same && t < p.tables.size(); ++t) {
        same = p.tables[t].id == a.tables[t].id && p.tables[t].rows == a.tables[t].rows &&
               p.tables[t].dim == a.tables[t].dim && p.tables[t].name == a.tables[t].name &&
               p.tables[t].optimizer == a.tables[t].optimizer;
      }
      if (!same) {
        return DataLossError("checkpoint " + path + ": " + PartName(i, n) +
                             " disagrees with part 0 (clock or tables); the folder mixes "
                             "checkpoints of different jobs");
      }
    }
    for (const CheckpointTable& t : p.tables) {
      const ShardRange want = PartitionOf(t.rows, n, i);
      if (t.shard_begin != want.begin || t.shard_rows != want.count || t.dim == 0) {
        return DataLossError(pd + "/manifest.json: table " + t.name +
                             " does not hold the rows the partition gives this part");
      }
      for (const CheckpointFile& f : t.files) {
        const std::string fp = pd + "/" + f.file;
        if (::stat(fp.c_str(), &st) != 0) {
          return DataLossError("checkpoint " + path + ": " + fp +
                               " is missing; restore another checkpoint");
        }
        if (static_cast<std::uint64_t>(st.st_size) != f.bytes) {
          return DataLossError("checkpoint " + path + ": " + fp + " is " +
                               std::to_string(st.st_size) + " bytes, its manifest says " +
                               std::to_string(f.bytes) +
                               " (truncated or damaged); restore another checkpoint");
        }
      }
    }
    parts.push_back(std::move(p));
  }
  return parts;
}

Result<std::string> FindLatestCheckpoint(const std::string& dir) {
  std::vector<std::uint64_t> clocks = ListCheckpoints(dir);
  std::string skipped;
  for (auto it = clocks.rbegin(); it != clocks.rend(); ++it) {
    const std::string path = dir + "/" + CheckpointName(*it);
    auto r = OpenCheckpoint(path);
    if (r.ok()) return path;
    skipped += "\n  " + r.status().ToString();
  }
  return NotFoundError("no complete checkpoint under " + dir +
                       (skipped.empty() ? std::string(" (none at all)") : "; skipped:" + skipped) +
                       "\nstart without --restore, or point --checkpoint_dir at the right folder");
}

Status CheckCheckpointTables(const std::vector<CheckpointPart>& parts,
                             const std::vector<TableOptions>& tables, const std::string& path) {
  const std::vector<CheckpointTable>& have = parts.front().tables;
  const std::string fix =
      "; restore with the table list the checkpoint was written with (its manifest.json "
      "lists them), or start without --restore";
  for (const TableOptions& t : tables) {
    auto it = std::find_if(have.begin(), have.end(),
                           [&](const CheckpointTable& c) { return c.id == t.id; });
    if (it == have.end()) {
      return FailedPreconditionError("checkpoint " + path + " has no table " +
                                     std::to_string(t.id) + " ('" + t.name + "')" + fix);
    }
    const std::string kind = OptimizerKindName(t.optimizer.kind);
    if (it->name != t.name || it->rows != t.rows || it->dim != t.dim || it->optimizer != kind) {
      return FailedPreconditionError("checkpoint " + path + ": table " + std::to_string(t.id) +
                                     " is '" + it->name + "' " + std::to_string(it->rows) + " x " +
                                     std::to_string(it->dim) + " (" + it->optimizer + ") there, '" +
                                     t.name + "' " + std::to_string(t.rows) + " x " +
                                     std::to_string(t.dim) + " (" + kind + ") here" + fix);
    }
  }
  if (have.size() != tables.size()) {
    return FailedPreconditionError("checkpoint " + path + " has " + std::to_string(have.size()) +
                                   " tables, this server " + std::to_string(tables.size()) + fix);
  }
  return Status::OK();
}

Status RestoreTable(const std::vector<CheckpointPart>& parts, const ShardView& v) {
  const std::uint32_t dim = v.options->dim;
  const ShardRange mine = v.shard;
  std::vector<StateTensor> tensors = StateTensors(v.options->optimizer.kind, dim);
  for (const CheckpointPart& p : parts) {
    const CheckpointTable* t = nullptr;
    for (const CheckpointTable& c : p.tables) {
      if (c.id == v.options->id) t = &c;
    }
    if (t == nullptr) return DataLossError(p.path + ": no table " + v.options->name);
    const std::uint64_t lo = std::max(mine.begin, t->shard_begin);
    const std::uint64_t hi = std::min(mine.end(), t->shard_begin + t->shard_rows);
    if (lo >= hi) continue;
    // Each tensor: "rows" into the shard, the others into the state.
    for (std::size_t k = 0; k <= tensors.size(); ++k) {
      const std::string name = k == 0 ? "rows" : tensors[k - 1].name;
      const std::size_t columns = k == 0 ? dim : tensors[k - 1].width;
      const std::string dtype = k > 0 && tensors[k - 1].u32 ? "<u4" : "<f4";
      auto f = std::find_if(t->files.begin(), t->files.end(),
                            [&](const CheckpointFile& c) { return c.tensor == name; });
      if (f == t->files.end()) {
        return DataLossError(p.path + "/manifest.json: table " + t->name + " has no '" + name +
                             "' tensor; the checkpoint is damaged");
      }
      RDMAPS_ASSIGN_OR_RETURN(NpyReader r, OpenNpy(p.path, *f, t->shard_rows, columns, dtype));
      // The whole file feeds the checksum; the rows in [lo, hi) are copied.
      XXH3_state_t* st = XXH3_createState();
      XXH3_64bits_reset(st);
      std::vector<char> buf(kIoChunk);
      std::uint64_t at = 0;
      const std::uint64_t row_bytes = columns * 4;
      Status s;
      while (s.ok()) {
        const ssize_t n = ::pread(r.fd.get(), buf.data(), buf.size(), static_cast<off_t>(at));
        if (n < 0) {
          if (errno == EINTR) continue;
          s = ErrnoError("reading " + r.path, errno);
          break;
        }
        if (n == 0) break;
        XXH3_64bits_update(st, buf.data(), static_cast<std::size_t>(n));
        // Copy the part of [at, at + n) that is data of rows [lo, hi).
        const std::uint64_t d0 = r.data_offset + (lo - t->shard_begin) * row_bytes;
        const std::uint64_t d1 = r.data_offset + (hi - t->shard_begin) * row_bytes;
        const std::uint64_t c0 = std::max(at, d0), c1 = std::min<std::uint64_t>(at + n, d1);
        for (std::uint64_t b = c0; b < c1;) {
          const std::uint64_t row = (b - r.data_offset) / row_bytes;  // of the part
          const std::uint64_t in_row = (b - r.data_offset) % row_bytes;
          const std::uint64_t take = std::min(c1 - b, row_bytes - in_row);
          const std::uint64_t local = t->shard_begin + row - mine.begin;
          std::byte* dst = k == 0 ? v.memory + v.geometry.row(local) + in_row
                                  : reinterpret_cast<std::byte*>(v.state + local * v.state_floats +
                                                                 tensors[k - 1].offset) +
                                        in_row;
          std::memcpy(dst, buf.data() + (b - at), take);
          b += take;
        }
        at += static_cast<std::uint64_t>(n);
      }
      const std::uint64_t digest = XXH3_64bits_digest(st);
      XXH3_freeState(st);
      RDMAPS_RETURN_IF_ERROR(s);
      if (at != f->bytes || digest != f->xxh3) {
        return DataLossError("checkpoint file " + r.path + " fails its checksum (xxh3 " +
                             Hex(digest) + ", manifest says " + Hex(f->xxh3) +
                             "): it is damaged; restore another checkpoint");
      }
    }
  }
  return Status::OK();
}

std::string CheckpointLineage(const std::string& job_token, const std::string& restored_lineage,
                              std::optional<std::uint64_t> restored_clock) {
  const std::string key = job_token + "|" + restored_lineage + "|" +
                          (restored_clock ? std::to_string(*restored_clock) : "fresh");
  return Hex(XXH3_64bits(key.data(), key.size()));
}

// ---- CheckpointWriter --------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string dir, std::uint32_t keep,
                                   std::function<void(const ShardSnapshot&, const Status&)> done)
    : dir_(std::move(dir)), keep_(keep), done_(std::move(done)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::Submit(std::unique_ptr<ShardSnapshot> snap) {
  MutexLock lock(mu_);
  while (waiting_ != nullptr) cv_.wait(lock.native());
  waiting_ = std::move(snap);
  cv_.notify_all();
}

std::unique_ptr<ShardSnapshot> CheckpointWriter::TakeSpare() {
  MutexLock lock(mu_);
  if (spare_ == nullptr) return std::make_unique<ShardSnapshot>();
  return std::move(spare_);
}

void CheckpointWriter::Loop() {
  MutexLock lock(mu_);
  while (true) {
    while (!stop_ && waiting_ == nullptr) cv_.wait(lock.native());
    if (waiting_ == nullptr) return;  // stopping and drained
    std::unique_ptr<ShardSnapshot> snap = std::move(waiting_);
    cv_.notify_all();  // Submit may hand over the next one
    lock.Unlock();
    auto r = WriteCheckpointPart(dir_, *snap, keep_);
    if (!r.ok()) {
      RDMAPS_LOG(ERROR) << "checkpoint at clock " << snap->clock << " of server "
                        << snap->server_index << " failed: " << r.status();
    } else {
      RDMAPS_LOG(INFO) << "checkpoint at clock " << snap->clock << ": part " << snap->server_index
                       << " of " << snap->num_servers << " in " << *r;
    }
    done_(*snap, r.status());
    lock.Lock();
    spare_ = std::move(snap);
  }
}

}  // namespace rdmaps::internal
