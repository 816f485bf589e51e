// The IDX/gzip loader on files the test writes (plain and gzip, valid and
// broken in every way the loader checks), and on the real Fashion-MNIST files
// when the dataset-fashion-mnist package is installed.
#include "tools/train/idx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace rdmaps::train {
namespace {

using ::testing::HasSubstr;

std::vector<std::uint8_t> IdxBytes(std::uint8_t type, const std::vector<std::uint32_t>& dims,
                                   const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmaps_idx_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::vector<std::uint8_t>& bytes, bool gz) {
    const std::string path = dir_ + "/" + name;
    if (gz) {
      gzFile f = gzopen(path.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
      gzclose(f);
    } else {
      FILE* f = std::fopen(path.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
      std::fclose(f);
    }
    return path;
  }

  // Three 2x3 images and their labels.
  std::vector<std::uint8_t> Images() {
    std::vector<std::uint8_t> px(18);
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 10);
    return IdxBytes(0x08, {3, 2, 3}, px);
  }
  std::vector<std::uint8_t> Labels() { return IdxBytes(0x08, {3}, {7, 0, 9}); }

  std::string dir_;
};

TEST_F(IdxTest, ReadsGzipAndPlainFilesAlike) {
  for (bool gz : {true, false}) {
    SCOPED_TRACE(gz ? "gzip" : "plain");
    const std::string images = Write("img", Images(), gz);
    const std::string labels = Write("lbl", Labels(), gz);
    Result<Dataset> d = LoadIdxDataset(images, labels);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->n, 3u);
    EXPECT_EQ(d->rows, 2u);
    EXPECT_EQ(d->cols, 3u);
    EXPECT_EQ(d->features(), 6u);
    EXPECT_EQ(d->labels, (std::vector<std::uint8_t>{7, 0, 9}));
    EXPECT_EQ(d->image(1)[0], 60);
    EXPECT_EQ(d->image(2)[5], 170);
  }
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  Result<IdxArray> r = ReadIdxU8(dir_ + "/nope", 3);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("nope"));
}

TEST_F(IdxTest, WrongMagicOrRankIsDataLoss) {
  // Type 0x0D (float) instead of u8.
  const std::string floats = Write("f", IdxBytes(0x0D, {3}, {1, 2, 3}), true);
  EXPECT_EQ(ReadIdxU8(floats, 1).status().code(), StatusCode::kDataLoss);
  // A label file where images are expected.
  const std::string labels = Write("lbl", Labels(), true);
  Result<IdxArray> r = ReadIdxU8(labels, 3);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("0x00000801"));
  // Text, not IDX at all.
  const std::string text = Write("t", {'h', 'e', 'l', 'l', 'o'}, false);
  EXPECT_EQ(ReadIdxU8(text, 1).status().code(), StatusCode::kDataLoss);
}

TEST_F(IdxTest, TruncatedFilesAreDataLoss) {
  const std::vector<std::uint8_t> full = Images();
  for (bool gz : {true, false}) {
    for (std::size_t keep : {std::size_t{2}, std::size_t{9}, full.size() - 1}) {
      SCOPED_TRACE(std::to_string(keep) + (gz ? " gzip" : " plain"));
      const std::string path = Write(
          "cut", std::vector<std::uint8_t>(full.begin(), full.begin() + static_cast<long>(keep)),
          gz);
      Result<IdxArray> r = ReadIdxU8(path, 3);
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
      EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
    }
  }
}

TEST_F(IdxTest, CorruptGzipStreamIsDataLoss) {
  const std::string path = Write("z", Images(), true);
  // Chop the gzip stream in the middle of its compressed data.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 12);
  EXPECT_EQ(ReadIdxU8(path, 3).status().code(), StatusCode::kDataLoss);
}

TEST_F(IdxTest, TrailingBytesAndZeroDimensionsAreDataLoss) {
  std::vector<std::uint8_t> extra = Labels();
  extra.push_back(1);
  EXPECT_THAT(ReadIdxU8(Write("x", extra, true), 1).status().message(), HasSubstr("trailing"));
  EXPECT_EQ(ReadIdxU8(Write("zero", IdxBytes(0x08, {0}, {}), false), 1).status().code(),
            StatusCode::kDataLoss);
}

TEST_F(IdxTest, CountMismatchAndBadLabelsAreDataLoss) {
  const std::string images = Write("img", Images(), true);
  const std::string two_labels = Write("two", IdxBytes(0x08, {2}, {1, 2}), true);
  Result<Dataset> r = LoadIdxDataset(images, two_labels);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("do not belong together"));
  const std::string bad_label = Write("bad", IdxBytes(0x08, {3}, {1, 10, 2}), true);
  r = LoadIdxDataset(images, bad_label);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("label 10 of sample 1"));
}

TEST_F(IdxTest, MissingDatasetNamesThePackageAndTheFlag) {
  Result<Dataset> r = LoadFashionMnist(dir_, Split::kTrain);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("apt-get install dataset-fashion-mnist"));
  EXPECT_THAT(r.status().message(), HasSubstr("--data_dir"));
}

TEST_F(IdxTest, LoadsAFashionMnistFolderOfPlainFiles) {
  // 28x28 images are required; two samples.
  std::vector<std::uint8_t> px(2 * 28 * 28, 5);
  Write("t10k-images-idx3-ubyte", IdxBytes(0x08, {2, 28, 28}, px), false);
  Write("t10k-labels-idx1-ubyte", IdxBytes(0x08, {2}, {3, 4}), false);
  Result<Dataset> r = LoadFashionMnist(dir_, Split::kTest);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 2u);
  EXPECT_EQ(r->labels[1], 4);
  Truncate(*r, 1);
  EXPECT_EQ(r->n, 1u);
  EXPECT_EQ(r->pixels.size(), 28u * 28u);
}

TEST(FashionMnistTest, RealFilesLoadWithExpectedShapes) {
  if (!std::filesystem::exists(std::string(kDefaultFashionMnistDir) +
                               "/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (apt-get install "
                    "dataset-fashion-mnist)";
  }
  Result<Dataset> test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->n, 10000u);
  EXPECT_EQ(test->features(), 784u);
  // Fashion-MNIST's test set is balanced: 1000 samples per class.
  std::vector<int> counts(10);
  for (std::uint8_t l : test->labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 1000);
}

}  // namespace
}  // namespace rdmaps::train
