// Shared by the fuzz targets (tests/fuzz/*_fuzz.cc): a reader that takes
// fixed-size fields off the front of the fuzzer's bytes, and quiet logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "rdmaps/log.h"

namespace rdmaps::fuzz {

// Takes integers and byte runs off the front of the input; past the end it
// yields zeros, so every input is a valid sequence of fields.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size)
      : p_(reinterpret_cast<const char*>(data)), left_(size) {}
  template <typename T>
  T Take() {
    T v{};
    const std::size_t n = left_ < sizeof(T) ? left_ : sizeof(T);
    if (n == 0) return v;  // (p_ may be null: libFuzzer's empty input)
    std::memcpy(&v, p_, n);
    p_ += n;
    left_ -= n;
    return v;
  }
  std::string_view Rest() const {
    return left_ == 0 ? std::string_view() : std::string_view(p_, left_);
  }

 private:
  const char* p_;
  std::size_t left_;
};

// Refused input is logged as warnings by design; the fuzzer needs none.
inline void QuietLogs() {
  static const bool once = [] {
    SetMinLogSeverity(LogSeverity::kError);
    SetLogSink([](LogSeverity, std::string_view, int, std::string_view) {});
    return true;
  }();
  (void)once;
}

// The fuzzers' oracle: an accepted input broke a promise of the parser.
#define RDMAPS_FUZZ_ASSERT(cond)                                                                   \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      __builtin_fprintf(stderr, "fuzz assertion failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

}  // namespace rdmaps::fuzz
