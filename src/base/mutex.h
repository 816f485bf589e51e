// Mutexes whose locking rules the compiler checks.
//
// clang's -Wthread-safety (on in every clang build of rdmaps, an error with
// RDMAPS_WERROR) proves at compile time that a member marked
// RDMAPS_GUARDED_BY(mu_) is touched only with mu_ held and that a function
// marked RDMAPS_REQUIRES(mu_) is called only so. libstdc++'s std::mutex
// carries no capability attributes, hence these thin wrappers; g++ ignores
// the attributes and the wrappers cost nothing.
//
//   class Counter {
//    public:
//     void Add() {
//       MutexLock lock(mu_);
//       ++n_;
//       cv_.notify_all();
//     }
//     // Waits with an explicit loop, so the analysis sees mu_ held where
//     // n_ is read (a predicate lambda would hide it).
//     bool WaitFor(int n, Deadline d) {
//       MutexLock lock(mu_);
//       while (n_ < n) {
//         if (cv_.wait_until(lock.native(), d) == std::cv_status::timeout) return n_ >= n;
//       }
//       return true;
//     }
//    private:
//     Mutex mu_;
//     std::condition_variable cv_;
//     int n_ RDMAPS_GUARDED_BY(mu_) = 0;
//   };
//
// A rule the analysis cannot follow (a member touched only by one thread, or
// before threads start) is written as a comment beside the member, and the
// function that breaks the analysis says why with
// RDMAPS_NO_THREAD_SAFETY_ANALYSIS.
//
// Thread safety: these are the primitives.
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define RDMAPS_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define RDMAPS_THREAD_ANNOTATION_(x)
#endif

#define RDMAPS_CAPABILITY(name) RDMAPS_THREAD_ANNOTATION_(capability(name))
#define RDMAPS_SCOPED_CAPABILITY RDMAPS_THREAD_ANNOTATION_(scoped_lockable)
#define RDMAPS_GUARDED_BY(x) RDMAPS_THREAD_ANNOTATION_(guarded_by(x))
#define RDMAPS_PT_GUARDED_BY(x) RDMAPS_THREAD_ANNOTATION_(pt_guarded_by(x))
#define RDMAPS_REQUIRES(...) RDMAPS_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define RDMAPS_REQUIRES_SHARED(...) \
  RDMAPS_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define RDMAPS_EXCLUDES(...) RDMAPS_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define RDMAPS_ACQUIRE(...) RDMAPS_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RDMAPS_ACQUIRE_SHARED(...) \
  RDMAPS_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RDMAPS_RELEASE(...) RDMAPS_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RDMAPS_RELEASE_SHARED(...) \
  RDMAPS_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define RDMAPS_RELEASE_GENERIC(...) \
  RDMAPS_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
#define RDMAPS_TRY_ACQUIRE(...) RDMAPS_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define RDMAPS_RETURN_CAPABILITY(x) RDMAPS_THREAD_ANNOTATION_(lock_returned(x))
#define RDMAPS_NO_THREAD_SAFETY_ANALYSIS RDMAPS_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace rdmaps {

class RDMAPS_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() RDMAPS_ACQUIRE() { mu_.lock(); }
  void unlock() RDMAPS_RELEASE() { mu_.unlock(); }
  bool try_lock() RDMAPS_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // For std::condition_variable, through MutexLock::native().
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock()/Lock() drop and retake it inside the
// scope (e.g. around a blocking call), and the analysis follows them.
class RDMAPS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) RDMAPS_ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() RDMAPS_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RDMAPS_RELEASE() { lock_.unlock(); }
  void Lock() RDMAPS_ACQUIRE() { lock_.lock(); }

  // What std::condition_variable::wait* take. A wait releases and retakes
  // the mutex before it returns, so the capability is held again after it.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A reader-writer mutex: many readers or one writer.
class RDMAPS_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() RDMAPS_ACQUIRE() { mu_.lock(); }
  void unlock() RDMAPS_RELEASE() { mu_.unlock(); }
  void lock_shared() RDMAPS_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() RDMAPS_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class RDMAPS_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) RDMAPS_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterLock() RDMAPS_RELEASE() { mu_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

class RDMAPS_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) RDMAPS_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderLock() RDMAPS_RELEASE() { mu_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

}  // namespace rdmaps
