// SignalThread: a tool's SIGTERM, SIGINT and SIGUSR1 taken as ordinary code
// on a thread of its own (rdmaps-server's shutdown and checkpoint triggers).
//
//   rdmaps::tools::SignalThread signals;  // in main(), before any thread
//   signals.Start([&](int sig) { ... });  // on the signal thread
//   ...
//   if (signals.StopSignal(std::chrono::seconds(5)) != 0) { /* stopped by signal */ }
//
// The constructor blocks the signals in the calling thread, so every thread
// started after it inherits the mask and glog's failure handler never sees
// SIGTERM. SIGUSR2 is internal: Join() wakes the thread with it.
//
// Thread safety: construct, Start and Join from one thread; received() and
// StopSignal() from any.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace rdmaps::tools {

class SignalThread {
 public:
  SignalThread() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGUSR1);  // a checkpoint (not a stop)
    sigaddset(&set_, SIGUSR2);  // internal: wakes the thread at exit
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  ~SignalThread() { Join(); }
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

  // Calls on_signal(sig) on the signal thread for every signal of the set
  // but SIGUSR2, one at a time.
  template <typename Fn>
  void Start(Fn on_signal) {
    thread_ = std::thread([this, on_signal] {
      int sig = 0;
      while (sigwait(&set_, &sig) == 0) {
        if (sig == SIGUSR2) return;
        if (sig != SIGUSR1) received_.store(sig);
        on_signal(sig);
        if (sig != SIGUSR1) {
          std::lock_guard<std::mutex> lock(mu_);
          handled_ = sig;
          handled_cv_.notify_all();
        }
      }
    });
  }

  // Ends the thread; signals that arrive later stay blocked and pending.
  void Join() {
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGUSR2);
      thread_.join();
    }
  }

  // The stop signal (SIGTERM or SIGINT) received, or 0.
  int received() const { return received_.load(); }

  // received(), for the exit decision. A stop signal that is pending but not
  // yet handled is waited for (up to `within`): a launcher that stops a whole
  // job signals every process at once, and a server's workers may vanish, and
  // its Run end, before its own signal thread has run. The exit then reports
  // the signal, not its consequence ("workers disconnected").
  int StopSignal(std::chrono::milliseconds within) {
    sigset_t pending;
    sigemptyset(&pending);
    const bool stop_pending = sigpending(&pending) == 0 && (sigismember(&pending, SIGTERM) == 1 ||
                                                            sigismember(&pending, SIGINT) == 1);
    if ((stop_pending || received() != 0) && thread_.joinable()) {
      std::unique_lock<std::mutex> lock(mu_);
      handled_cv_.wait_for(lock, within, [this] { return handled_ != 0; });
    }
    return received();
  }

 private:
  sigset_t set_;
  std::atomic<int> received_{0};
  std::mutex mu_;
  std::condition_variable handled_cv_;
  int handled_ = 0;  // guarded by mu_: a stop signal whose handler returned
  std::thread thread_;
};

}  // namespace rdmaps::tools
