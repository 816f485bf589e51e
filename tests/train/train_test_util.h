// Data for the training tests that need no Fashion-MNIST files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tools/train/idx.h"

namespace rdmaps::train {

// A synthetic 28x28 data set: class c lights up pixel row c.
inline Dataset Synthetic(std::size_t n) {
  Dataset d;
  d.n = n;
  d.rows = 28;
  d.cols = 28;
  d.pixels.assign(n * 784, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::uint8_t>(i % 10);
    d.labels.push_back(c);
    for (std::size_t k = 0; k < 28; ++k) d.pixels[i * 784 + c * 28 + k] = 200;
    d.pixels[i * 784 + 783 - i % 50] = 255;  // noise
  }
  return d;
}

}  // namespace rdmaps::train
