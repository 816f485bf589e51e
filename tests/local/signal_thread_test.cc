// tools/common/signal_thread.h: rdmaps-server's signal thread. The case that
// matters is a launcher stopping a whole job at once: the server's Run may
// end (its workers vanished) while its own SIGINT is still pending, and the
// exit must then report the signal. The signal thread is held busy in a
// SIGUSR1 handler so that the SIGINT is pending when StopSignal() looks;
// it is let go only once the main thread sleeps (inside StopSignal's wait,
// or, without that wait, in the join below), so the order is forced, not
// timed. Every wait has a deadline.
#include "tools/common/signal_thread.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>

namespace rdmaps::tools {
namespace {

constexpr auto kHangGuard = std::chrono::seconds(30);

// The scheduler state of thread `tid` of this process ('R' running, 'S'
// sleeping, ...), from /proc/self/task/TID/stat; '?' if unreadable.
char ThreadState(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const auto paren = stat.rfind(')');  // the name may hold spaces and ')'
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

// Restores the calling thread's signal mask: SignalThread leaves its
// signals blocked.
class SignalThreadTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &saved_), 0); }
  void TearDown() override { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  sigset_t saved_;
};

TEST_F(SignalThreadTest, APendingStopSignalIsWaitedForUntilItsHandlerReturned) {
  std::promise<void> busy;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> stop_handled{false};
  {
    SignalThread signals;
    signals.Start([&](int sig) {
      if (sig == SIGUSR1) {
        busy.set_value();
        (void)released.wait_for(kHangGuard);
      } else if (sig == SIGINT) {
        stop_handled.store(true);
      }
    });
    ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
    ASSERT_EQ(busy.get_future().wait_for(kHangGuard), std::future_status::ready);
    ASSERT_EQ(kill(getpid(), SIGINT), 0);  // pending: the only taker is busy
    EXPECT_EQ(signals.received(), 0);

    const pid_t main_tid = gettid();
    std::atomic<bool> calling{false};
    std::thread releaser([&] {
      const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
      while (!(calling.load() && ThreadState(main_tid) == 'S') &&
             std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
      release.set_value();
    });
    calling.store(true);  // the main thread's next sleep is in StopSignal (or the join)
    const int stop = signals.StopSignal(kHangGuard);
    releaser.join();
    EXPECT_EQ(stop, SIGINT);
    EXPECT_TRUE(stop_handled.load()) << "StopSignal returned before the handler";
    // The SIGINT must be taken before the thread ends, or the restored mask
    // would deliver it to the test.
    ASSERT_EQ(signals.StopSignal(kHangGuard), SIGINT);
  }
  sigset_t pending;
  ASSERT_EQ(sigpending(&pending), 0);
  EXPECT_FALSE(sigismember(&pending, SIGINT));
  EXPECT_FALSE(sigismember(&pending, SIGUSR1));
}

TEST_F(SignalThreadTest, WithoutAStopSignalStopSignalReturnsZeroAtOnce) {
  SignalThread signals;
  signals.Start([](int) {});
  // Nothing pending, nothing received: no wait (the guard would fail the
  // ctest timeout long before).
  EXPECT_EQ(signals.StopSignal(std::chrono::hours(1)), 0);
}

}  // namespace
}  // namespace rdmaps::tools
