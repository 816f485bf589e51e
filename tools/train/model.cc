#include "tools/train/model.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace rdmaps::train {
namespace {

// Fashion-MNIST's pixel mean and standard deviation (on [0, 1]).
constexpr double kPixelMean = 0.2860;
constexpr double kPixelStddev = 0.3530;

}  // namespace

std::vector<TableShape> ParameterTables(const ModelSpec& spec) {
  std::vector<TableShape> out;
  std::vector<int> widths = {spec.inputs};
  widths.insert(widths.end(), spec.hidden.begin(), spec.hidden.end());
  widths.push_back(spec.classes);
  const std::size_t layers = widths.size() - 1;
  for (std::size_t l = 0; l < layers; ++l) {
    const auto fan_in = static_cast<std::size_t>(widths[l]);
    const auto fan_out = static_cast<std::size_t>(widths[l + 1]);
    double stddev = 0;
    if (l + 1 < layers) {
      stddev = std::sqrt(2.0 / static_cast<double>(fan_in));
    } else if (layers > 1) {
      stddev = std::sqrt(1.0 / static_cast<double>(fan_in));
    }
    out.push_back({"w" + std::to_string(l), fan_in, fan_out, stddev});
    out.push_back({"b" + std::to_string(l), 1, fan_out, 0.0});
  }
  return out;
}

template <typename T>
Params<T> ZeroParams(const ModelSpec& spec) {
  Params<T> out;
  for (const TableShape& t : ParameterTables(spec)) out.emplace_back(t.size(), T(0));
  return out;
}

template <typename T>
Mlp<T>::Mlp(ModelSpec spec)
    : spec_(std::move(spec)), tables_(ParameterTables(spec_)), layers_(tables_.size() / 2) {
  CHECK_GT(spec_.inputs, 0);
  CHECK_GT(spec_.classes, 1);
  acts_.resize(layers_ + 1);
}

template <typename T>
void Mlp<T>::Forward(const Params<T>& params, const T* x, std::size_t batch) {
  CHECK_EQ(params.size(), tables_.size()) << "parameter tables do not match the model";
  const auto b = static_cast<Eigen::Index>(batch);
  for (std::size_t l = 0; l < layers_; ++l) {
    const TableShape& ws = tables_[2 * l];
    CHECK_EQ(params[2 * l].size(), ws.size());
    CHECK_EQ(params[2 * l + 1].size(), ws.dim);
    const auto in = static_cast<Eigen::Index>(ws.rows);
    const auto out = static_cast<Eigen::Index>(ws.dim);
    Eigen::Map<const Matrix> w(params[2 * l].data(), in, out);
    Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> bias(params[2 * l + 1].data(), out);
    Matrix& z = acts_[l + 1];
    z.resize(b, out);
    if (l == 0) {
      Eigen::Map<const Matrix> input(x, b, in);
      z.noalias() = input * w;
    } else {
      z.noalias() = acts_[l] * w;
    }
    z.rowwise() += bias;
    if (l + 1 < layers_) {
      z = z.cwiseMax(T(0));
    } else {
      // Softmax, stabilised by the row maximum.
      for (Eigen::Index i = 0; i < b; ++i) {
        auto row = z.row(i);
        row.array() = (row.array() - row.maxCoeff()).exp();
        row /= row.sum();
      }
    }
  }
}

template <typename T>
T Mlp<T>::CrossEntropy(const std::uint8_t* labels, std::size_t batch) const {
  const Matrix& p = acts_[layers_];
  T loss = 0;
  for (std::size_t i = 0; i < batch; ++i) {
    const T pi = p(static_cast<Eigen::Index>(i), labels[i]);
    loss -= std::log(std::max(pi, std::numeric_limits<T>::min()));
  }
  return loss / static_cast<T>(batch);
}

template <typename T>
T Mlp<T>::ForwardBackward(const Params<T>& params, const T* x, const std::uint8_t* labels,
                          std::size_t batch, Params<T>& grads) {
  CHECK_GT(batch, 0u);
  Forward(params, x, batch);
  const T loss = CrossEntropy(labels, batch);
  const auto b = static_cast<Eigen::Index>(batch);
  grads.resize(tables_.size());
  // d(mean loss)/d(logits) = (p - onehot(label)) / batch.
  delta_ = acts_[layers_];
  for (Eigen::Index i = 0; i < b; ++i) delta_(i, labels[i]) -= T(1);
  delta_ /= static_cast<T>(batch);
  for (std::size_t l = layers_; l-- > 0;) {
    const TableShape& ws = tables_[2 * l];
    const auto in = static_cast<Eigen::Index>(ws.rows);
    const auto out = static_cast<Eigen::Index>(ws.dim);
    grads[2 * l].resize(ws.size());
    grads[2 * l + 1].resize(ws.dim);
    Eigen::Map<Matrix> dw(grads[2 * l].data(), in, out);
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> db(grads[2 * l + 1].data(), out);
    if (l == 0) {
      Eigen::Map<const Matrix> input(x, b, in);
      dw.noalias() = input.transpose() * delta_;
    } else {
      dw.noalias() = acts_[l].transpose() * delta_;
    }
    db = delta_.colwise().sum();
    if (l > 0) {
      Eigen::Map<const Matrix> w(params[2 * l].data(), in, out);
      delta_prev_.resize(b, in);
      delta_prev_.noalias() = delta_ * w.transpose();
      // ReLU: pass the gradient where the activation was positive.
      delta_prev_.array() *= (acts_[l].array() > T(0)).template cast<T>();
      std::swap(delta_, delta_prev_);
    }
  }
  return loss;
}

template <typename T>
T Mlp<T>::Loss(const Params<T>& params, const T* x, const std::uint8_t* labels, std::size_t batch) {
  CHECK_GT(batch, 0u);
  Forward(params, x, batch);
  return CrossEntropy(labels, batch);
}

template <typename T>
std::size_t Mlp<T>::CountCorrect(const Params<T>& params, const T* x, const std::uint8_t* labels,
                                 std::size_t batch) {
  if (batch == 0) return 0;
  Forward(params, x, batch);
  const Matrix& p = acts_[layers_];
  std::size_t correct = 0;
  for (std::size_t i = 0; i < batch; ++i) {
    Eigen::Index arg = 0;
    p.row(static_cast<Eigen::Index>(i)).maxCoeff(&arg);
    if (arg == labels[i]) ++correct;
  }
  return correct;
}

template <typename T>
void PixelsToFeatures(const std::uint8_t* pixels, std::size_t count, T* out) {
  const double scale = 1.0 / (255.0 * kPixelStddev);
  const double shift = kPixelMean / kPixelStddev;
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = static_cast<T>(pixels[i] * scale - shift);
  }
}

template class Mlp<float>;
template class Mlp<double>;
template Params<float> ZeroParams<float>(const ModelSpec&);
template Params<double> ZeroParams<double>(const ModelSpec&);
template void PixelsToFeatures<float>(const std::uint8_t*, std::size_t, float*);
template void PixelsToFeatures<double>(const std::uint8_t*, std::size_t, double*);

}  // namespace rdmaps::train
