// Reading IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or
// plain, into memory, and loading the Fashion-MNIST data set from a folder.
//
// IDX: big-endian u32 magic 0x0000TTNN (TT = element type, 0x08 = u8; NN =
// number of dimensions), then NN big-endian u32 sizes, then the elements in
// row-major order. Every malformed input (wrong magic, wrong rank, a size of
// zero or too large, a file shorter than its header says, trailing bytes,
// labels out of range, image and label counts that disagree) is a Status
// naming the file and the fix; nothing here aborts.
//
// Thread safety: free functions without shared state; a Dataset is a plain
// value (read it concurrently, mutate it from one thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rdmaps/status.h"

namespace rdmaps::train {

// An IDX array of unsigned bytes: its dimensions and its elements.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;  // Product of dims elements, row-major.
};

// Reads an IDX file of u8 elements with `expected_rank` dimensions. The file
// may be gzip-compressed or not (zlib reads both). NotFound when the file is
// missing, DataLoss when it is truncated or malformed.
Result<IdxArray> ReadIdxU8(const std::string& path, int expected_rank);

// A labelled image set: n images of rows x cols u8 pixels, labels in
// [0, num_classes).
struct Dataset {
  std::size_t n = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  int num_classes = 10;
  std::vector<std::uint8_t> pixels;  // n * rows * cols, image-major.
  std::vector<std::uint8_t> labels;  // n.

  std::size_t features() const { return rows * cols; }
  const std::uint8_t* image(std::size_t i) const { return pixels.data() + i * features(); }
};

// Reads an image file (rank 3) and a label file (rank 1) into a Dataset,
// checking that the counts agree and every label is < num_classes.
Result<Dataset> LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                               int num_classes = 10);

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

// Loads Fashion-MNIST's train (60000) or test (10000) split from `dir`, which
// holds {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. NotFound naming
// `apt-get install dataset-fashion-mnist` and --data_dir when absent.
Result<Dataset> LoadFashionMnist(const std::string& dir, Split split);

// Keeps the first `limit` samples (all when limit is 0 or >= n).
void Truncate(Dataset& d, std::size_t limit);

}  // namespace rdmaps::train
