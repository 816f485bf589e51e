// A multilayer perceptron classifier written with Eigen: softmax regression
// (no hidden layer) or an MLP with ReLU hidden layers, trained with the mean
// softmax cross-entropy over a mini-batch.
//
// Parameters are a list of flat tables, one per weight matrix and one per
// bias, laid out exactly like the parameter server's row tables (rows x dim,
// row-major, float32): layer l has table "w<l>" with rows = fan_in,
// dim = fan_out (row r holds the weights leaving input r) and table "b<l>"
// with rows = 1, dim = fan_out. A worker pulls these tables, calls
// ForwardBackward, and pushes the gradient tables, which have the same shapes.
//
// Mlp<T> is instantiated for float (training) and double (gradient checks).
// Thread safety: an Mlp keeps scratch buffers, so one thread uses it at a
// time; the parameters are the caller's and are only read.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rdmaps::train {

struct ModelSpec {
  int inputs = 784;
  std::vector<int> hidden;  // Empty: softmax regression.
  int classes = 10;
};

// The shape of one parameter table and how to initialise it (the servers
// do: see ModelTables in tools/train/tables.h).
struct TableShape {
  std::string name;  // "w0", "b0", "w1", ...
  std::size_t rows = 0;
  std::size_t dim = 0;
  double init_stddev = 0;  // Normal(0, stddev); 0 means zeros.
  std::size_t size() const { return rows * dim; }
};

// The tables of `spec`, in layer order (w0, b0, w1, b1, ...). Weights get He
// initialisation (stddev sqrt(2 / fan_in)) before a ReLU, sqrt(1 / fan_in)
// for the output layer of an MLP, and zeros for softmax regression.
std::vector<TableShape> ParameterTables(const ModelSpec& spec);

// One flat vector per table, in ParameterTables order.
template <typename T>
using Params = std::vector<std::vector<T>>;

// Tables of the right sizes, all zero (gradient buffers).
template <typename T>
Params<T> ZeroParams(const ModelSpec& spec);

template <typename T>
class Mlp {
 public:
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  explicit Mlp(ModelSpec spec);

  const ModelSpec& spec() const { return spec_; }
  const std::vector<TableShape>& tables() const { return tables_; }

  // x: batch rows of spec().inputs features (row-major); labels: batch class
  // indices. Writes d(loss)/d(params) into `grads` (resized if needed) and
  // returns the mean cross-entropy loss of the batch.
  T ForwardBackward(const Params<T>& params, const T* x, const std::uint8_t* labels,
                    std::size_t batch, Params<T>& grads);

  // Mean cross-entropy loss only (no gradients).
  T Loss(const Params<T>& params, const T* x, const std::uint8_t* labels, std::size_t batch);

  // How many of the batch's samples the model classifies correctly.
  std::size_t CountCorrect(const Params<T>& params, const T* x, const std::uint8_t* labels,
                           std::size_t batch);

 private:
  // Fills acts_ (acts_.back() = softmax probabilities).
  void Forward(const Params<T>& params, const T* x, std::size_t batch);
  T CrossEntropy(const std::uint8_t* labels, std::size_t batch) const;

  // Constant after construction.
  const ModelSpec spec_;
  const std::vector<TableShape> tables_;
  const std::size_t layers_;

  // Scratch, reused between calls.
  std::vector<Matrix> acts_;  // acts_[l]: output of layer l-1 (acts_[0] unused: input).
  Matrix delta_;
  Matrix delta_prev_;
};

// Converts images to features: (pixel / 255 - mean) / stddev with
// Fashion-MNIST's mean and stddev.
template <typename T>
void PixelsToFeatures(const std::uint8_t* pixels, std::size_t count, T* out);

}  // namespace rdmaps::train
