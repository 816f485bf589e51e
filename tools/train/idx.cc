#include "tools/train/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

namespace rdmaps::train {
namespace {

constexpr std::uint8_t kIdxTypeU8 = 0x08;
// Refuse headers that claim more than this many elements (a corrupt size).
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 32;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

std::uint32_t LoadBigEndian32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// Reads up to `len` bytes; returns how many were read (fewer only at EOF).
Result<std::size_t> ReadFully(gzFile f, const std::string& path, void* buf, std::size_t len) {
  auto* out = static_cast<std::uint8_t*>(buf);
  std::size_t done = 0;
  while (done < len) {
    const std::size_t want = std::min<std::size_t>(len - done, 1u << 30);
    const int got = gzread(f, out + done, static_cast<unsigned>(want));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      return DataLossError(path + ": cannot decompress (" + (msg ? msg : "zlib error") +
                           "); the file is corrupt - reinstall it (for Fashion-MNIST: "
                           "`apt-get install --reinstall dataset-fashion-mnist`)");
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

Status Truncated(const std::string& path, std::string_view what, std::size_t got,
                 std::size_t want) {
  return DataLossError(path + ": truncated IDX file: " + std::string(what) + " has " +
                       std::to_string(got) + " of " + std::to_string(want) +
                       " bytes; the file is damaged or incomplete - fetch or reinstall it");
}

// Returns "<dir>/<name>.gz" if present, else "<dir>/<name>", else "".
std::string FindFile(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name}) {
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate;
  }
  return "";
}

}  // namespace

Result<IdxArray> ReadIdxU8(const std::string& path, int expected_rank) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError(path + ": no such file");
  }
  GzFile f(gzopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return ErrnoError("gzopen(" + path + ")", errno);
  }
  std::uint8_t header[4];
  RDMAPS_ASSIGN_OR_RETURN(std::size_t got, ReadFully(f.get(), path, header, sizeof(header)));
  if (got != sizeof(header)) return Truncated(path, "the magic number", got, sizeof(header));
  const std::uint32_t magic = LoadBigEndian32(header);
  const int rank = header[3];
  if (header[0] != 0 || header[1] != 0 || header[2] != kIdxTypeU8 || rank != expected_rank) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    return DataLossError(path + ": not an IDX file of u8 with " + std::to_string(expected_rank) +
                         " dimensions (magic " + hex + ", expected 0x0000080" +
                         std::to_string(expected_rank) +
                         "); check that the path points at the right file");
  }
  IdxArray out;
  out.dims.resize(static_cast<std::size_t>(rank));
  std::vector<std::uint8_t> dim_bytes(4 * static_cast<std::size_t>(rank));
  RDMAPS_ASSIGN_OR_RETURN(got, ReadFully(f.get(), path, dim_bytes.data(), dim_bytes.size()));
  if (got != dim_bytes.size()) return Truncated(path, "the dimension list", got, dim_bytes.size());
  std::uint64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    out.dims[static_cast<std::size_t>(i)] = LoadBigEndian32(dim_bytes.data() + 4 * i);
    elements *= out.dims[static_cast<std::size_t>(i)];
    if (out.dims[static_cast<std::size_t>(i)] == 0 || elements > kMaxElements) {
      return DataLossError(path + ": IDX dimension " + std::to_string(i) + " is " +
                           std::to_string(out.dims[static_cast<std::size_t>(i)]) +
                           " (zero or the total exceeds 2^32 elements); the header is corrupt");
    }
  }
  out.data.resize(static_cast<std::size_t>(elements));
  RDMAPS_ASSIGN_OR_RETURN(got, ReadFully(f.get(), path, out.data.data(), out.data.size()));
  if (got != out.data.size()) return Truncated(path, "the data", got, out.data.size());
  std::uint8_t extra;
  RDMAPS_ASSIGN_OR_RETURN(got, ReadFully(f.get(), path, &extra, 1));
  if (got != 0) {
    return DataLossError(path + ": trailing bytes after " + std::to_string(elements) +
                         " elements; the header and the data disagree, the file is corrupt");
  }
  return out;
}

Result<Dataset> LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                               int num_classes) {
  RDMAPS_ASSIGN_OR_RETURN(IdxArray images, ReadIdxU8(images_path, 3));
  RDMAPS_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxU8(labels_path, 1));
  if (images.dims[0] != labels.dims[0]) {
    return DataLossError(images_path + " holds " + std::to_string(images.dims[0]) + " images but " +
                         labels_path + " holds " + std::to_string(labels.dims[0]) +
                         " labels; the two files do not belong together");
  }
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes) {
      return DataLossError(labels_path + ": label " + std::to_string(labels.data[i]) +
                           " of sample " + std::to_string(i) + " is not below " +
                           std::to_string(num_classes) + "; the label file is corrupt");
    }
  }
  Dataset d;
  d.n = images.dims[0];
  d.rows = images.dims[1];
  d.cols = images.dims[2];
  d.num_classes = num_classes;
  d.pixels = std::move(images.data);
  d.labels = std::move(labels.data);
  return d;
}

Result<Dataset> LoadFashionMnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_name = prefix + "-images-idx3-ubyte";
  const std::string labels_name = prefix + "-labels-idx1-ubyte";
  const std::string images = FindFile(dir, images_name);
  const std::string labels = FindFile(dir, labels_name);
  if (images.empty() || labels.empty()) {
    return NotFoundError("Fashion-MNIST not found: " + dir + "/" +
                         (images.empty() ? images_name : labels_name) +
                         "[.gz] is missing; install Debian's package with "
                         "`apt-get install dataset-fashion-mnist` (files go to " +
                         std::string(kDefaultFashionMnistDir) +
                         ") or point --data_dir at a folder holding the four IDX files");
  }
  RDMAPS_ASSIGN_OR_RETURN(Dataset d, LoadIdxDataset(images, labels, 10));
  if (d.rows != 28 || d.cols != 28) {
    return DataLossError(images + ": images are " + std::to_string(d.rows) + "x" +
                         std::to_string(d.cols) + ", Fashion-MNIST's are 28x28; check --data_dir");
  }
  return d;
}

void Truncate(Dataset& d, std::size_t limit) {
  if (limit == 0 || limit >= d.n) return;
  d.n = limit;
  d.pixels.resize(limit * d.features());
  d.labels.resize(limit);
}

}  // namespace rdmaps::train
