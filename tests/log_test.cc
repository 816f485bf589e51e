// Routing and thresholds of the library's log lines (rdmaps/log.h,
// src/base/log.h): the sink, glog once initialised, else stderr.
#include "rdmaps/log.h"

#include <glog/logging.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/base/log.h"

namespace rdmaps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct Line {
  LogSeverity severity;
  std::string file;
  int line;
  std::string message;
};

// Installs a sink that records every line, and restores the defaults after.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink(
        [this](LogSeverity severity, std::string_view file, int line, std::string_view message) {
          std::lock_guard<std::mutex> lock(mu_);
          lines_.push_back({severity, std::string(file), line, std::string(message)});
        });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetMinLogSeverity(LogSeverity::kWarning);
  }

  std::vector<std::string> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const Line& l : lines_) out.push_back(l.message);
    return out;
  }
  std::vector<Line> Lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<Line> lines_;
};

TEST_F(LogTest, DefaultThresholdIsWarning) {
  EXPECT_EQ(MinLogSeverity(), LogSeverity::kWarning);
  RDMAPS_LOG(VERBOSE) << "verbose";
  RDMAPS_LOG(INFO) << "info";
  RDMAPS_LOG(WARNING) << "warning";
  RDMAPS_LOG(ERROR) << "error";
  EXPECT_THAT(Messages(), ElementsAre("warning", "error"));
}

TEST_F(LogTest, SinkGetsSeverityBaseNameLineAndMessage) {
  SetMinLogSeverity(LogSeverity::kVerbose);
  const int line = __LINE__ + 1;
  RDMAPS_LOG(INFO) << "table " << 7 << " ready";
  RDMAPS_LOG(VERBOSE) << "detail";
  const std::vector<Line> lines = Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].severity, LogSeverity::kInfo);
  EXPECT_EQ(lines[0].file, "log_test.cc");
  EXPECT_EQ(lines[0].line, line);
  EXPECT_EQ(lines[0].message, "table 7 ready");
  EXPECT_EQ(lines[1].severity, LogSeverity::kVerbose);
}

TEST_F(LogTest, StatementBelowThresholdEvaluatesNothing) {
  SetMinLogSeverity(LogSeverity::kError);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  RDMAPS_LOG(WARNING) << "never " << count();
  RDMAPS_PLOG(INFO) << count();
  EXPECT_EQ(evaluated, 0);
  RDMAPS_LOG(ERROR) << "once " << count();
  EXPECT_EQ(evaluated, 1);
  EXPECT_THAT(Messages(), ElementsAre("once 1"));
}

TEST_F(LogTest, MacroIsOneStatementInsideIfElse) {
  bool other_branch = false;
  if (false)
    RDMAPS_LOG(ERROR) << "not taken";
  else
    other_branch = true;
  EXPECT_TRUE(other_branch);
  EXPECT_THAT(Messages(), IsEmpty());
}

TEST_F(LogTest, PlogAppendsErrnoAsItWasWhenTheStatementBegan) {
  errno = ECONNREFUSED;
  RDMAPS_PLOG(WARNING) << "connect" << (errno = 0, "");
  EXPECT_THAT(Messages(), ElementsAre("connect: " + std::string(std::strerror(ECONNREFUSED)) +
                                      " [" + std::to_string(ECONNREFUSED) + "]"));
}

TEST_F(LogTest, EveryNLogsTheFirstAndEveryNthAfter) {
  for (int i = 0; i < 7; ++i) RDMAPS_LOG_EVERY_N(WARNING, 3) << "occurrence " << i;
  EXPECT_THAT(Messages(), ElementsAre("occurrence 0", "occurrence 3", "occurrence 6"));
}

TEST_F(LogTest, EveryTLogsTheFirstAndSuppressesTheRestOfThePeriod) {
  // A period no test outlives: only the first of 1000 lines goes out.
  for (int i = 0; i < 1000; ++i) RDMAPS_LOG_EVERY_T(WARNING, 3600.0) << "flood " << i;
  EXPECT_THAT(Messages(), ElementsAre("flood 0"));
}

TEST_F(LogTest, RateLimiterCountsWhatItSuppressed) {
  internal::LogRateLimiter limiter;
  constexpr std::int64_t kSecond = 1000000000;
  EXPECT_EQ(limiter.TakeAt(1.0, 10 * kSecond), 1u);  // the first is always allowed
  for (int i = 0; i < 5; ++i) EXPECT_EQ(limiter.TakeAt(1.0, 10 * kSecond + i), 0u);
  // A second later: allowed, reporting the 5 suppressed before it.
  EXPECT_EQ(limiter.TakeAt(1.0, 11 * kSecond), 6u);
  EXPECT_EQ(limiter.TakeAt(1.0, 11 * kSecond + 1), 0u);
  { internal::LogMessage(internal::kLogWARNING, __FILE__, __LINE__, false, 5).stream() << "x"; }
  EXPECT_THAT(Messages(), ElementsAre("x [5 similar lines suppressed]"));
}

TEST_F(LogTest, EveryTIsOneStatementInsideIfElse) {
  bool else_taken = false;
  if (Messages().size() == 99)
    RDMAPS_LOG_EVERY_T(WARNING, 1.0) << "never";
  else
    else_taken = true;
  EXPECT_TRUE(else_taken);
  EXPECT_TRUE(Messages().empty());
}

TEST_F(LogTest, EmptySinkRestoresStderr) {
  SetLogSink(nullptr);
  ::testing::internal::CaptureStderr();
  RDMAPS_LOG(WARNING) << "to stderr";
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(Messages(), IsEmpty());
  EXPECT_THAT(err, HasSubstr("to stderr"));
}

TEST_F(LogTest, SinksMayBeReplacedWhileThreadsLog) {
  std::atomic<bool> stop{false};
  std::atomic<int> other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) RDMAPS_LOG(WARNING) << "busy";
    });
  }
  for (int i = 0; i < 100; ++i) {
    SetLogSink([&](LogSeverity, std::string_view, int, std::string_view) { ++other; });
    SetMinLogSeverity(i % 2 ? LogSeverity::kWarning : LogSeverity::kError);
  }
  SetLogSink([&](LogSeverity, std::string_view, int, std::string_view) { ++other; });
  SetMinLogSeverity(LogSeverity::kWarning);
  const int before = other.load();
  while (other.load() == before) std::this_thread::yield();
  stop = true;
  for (std::thread& t : threads) t.join();
}

// Without a sink or glog: WARNING and above, one line each on stderr, INFO
// dropped, and never glog's "Logging before InitGoogleLogging()".
TEST(LogDefaultTest, WithoutSinkOrGlogWarningsGoToStderrOnOneLine) {
  ASSERT_FALSE(google::IsGoogleLoggingInitialized());
  ::testing::internal::CaptureStderr();
  RDMAPS_LOG(INFO) << "quiet";
  const int line = __LINE__ + 1;
  RDMAPS_LOG(WARNING) << "peer refused";
  RDMAPS_LOG(ERROR) << "device removed";
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "[rdmaps WARNING log_test.cc:" + std::to_string(line) +
                     "] peer refused\n[rdmaps ERROR log_test.cc:" + std::to_string(line + 1) +
                     "] device removed\n");
}

// Once the program has initialised glog (the rdmaps tools do), every line
// goes to glog as glog would have logged it at the call site; VERBOSE only
// with --v=1. A sink still takes precedence.
class GlogCapture : public google::LogSink {
 public:
  GlogCapture() { google::AddLogSink(this); }
  ~GlogCapture() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char* base_filename, int line,
            const struct ::tm*, const char* message, size_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::to_string(severity) + " " + base_filename + ":" + std::to_string(line) +
                     " " + std::string(message, length));
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(LogGlogTest, InitialisedGlogReceivesEveryLine) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging("log_test");
  {
    GlogCapture glog;
    ::testing::internal::CaptureStderr();
    const int line = __LINE__ + 1;
    RDMAPS_LOG(INFO) << "layout from TF_CONFIG";
    RDMAPS_LOG(WARNING) << "refused";
    RDMAPS_LOG(VERBOSE) << "hidden without --v";
    FLAGS_v = 1;
    RDMAPS_LOG(VERBOSE) << "shown with --v=1";
    FLAGS_v = 0;
    const std::string err = ::testing::internal::GetCapturedStderr();
    const std::string at = " log_test.cc:";
    EXPECT_THAT(glog.lines(),
                ElementsAre("0" + at + std::to_string(line) + " layout from TF_CONFIG",
                            "1" + at + std::to_string(line + 1) + " refused",
                            "0" + at + std::to_string(line + 4) + " shown with --v=1"));
    EXPECT_THAT(err, Not(HasSubstr("[rdmaps")));

    std::vector<std::string> sunk;
    SetLogSink([&](LogSeverity, std::string_view, int, std::string_view message) {
      sunk.emplace_back(message);
    });
    RDMAPS_LOG(WARNING) << "to the sink";
    SetLogSink(nullptr);
    EXPECT_THAT(sunk, ElementsAre("to the sink"));
    EXPECT_EQ(glog.lines().size(), 3u);
  }
  google::ShutdownGoogleLogging();
}

}  // namespace
}  // namespace rdmaps
