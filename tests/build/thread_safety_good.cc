// Must compile under clang -Wthread-safety -Werror: the same class with the
// mutex held, a REQUIRES helper, a scoped Unlock()/Lock(), a reader lock and
// a condition-variable wait through MutexLock::native().
#include <chrono>
#include <condition_variable>

#include "src/base/mutex.h"

class Counter {
 public:
  int Get() const {
    rdmaps::MutexLock lock(mu_);
    return GetLocked();
  }
  void AddThenWait() {
    rdmaps::MutexLock lock(mu_);
    ++n_;
    lock.Unlock();
    cv_.notify_all();
    lock.Lock();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (n_ < 1) {
      if (cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
    }
  }
  int Shared() {
    rdmaps::ReaderLock lock(smu_);
    return s_;
  }

 private:
  int GetLocked() const RDMAPS_REQUIRES(mu_) { return n_; }

  mutable rdmaps::Mutex mu_;
  std::condition_variable cv_;
  int n_ RDMAPS_GUARDED_BY(mu_) = 0;
  rdmaps::SharedMutex smu_;
  int s_ RDMAPS_GUARDED_BY(smu_) = 0;
};

int main() {
  Counter c;
  c.AddThenWait();
  return c.Get() - 1 + c.Shared();
}
