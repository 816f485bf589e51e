#include "src/cluster/embedded_coordinator.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "src/base/fd.h"
#include "src/base/mutex.h"
#include "src/cluster/coord_store.h"

namespace rdmaps::internal {
namespace {

using Nanos = CoordStore::Nanos;

Nanos MonotonicNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(CoordClock::now().time_since_epoch())
      .count();
}

CoordClock::time_point FromNanos(Nanos ns) {
  return CoordClock::time_point(std::chrono::nanoseconds(ns));
}

Status DeadlinePassed(std::string_view what, std::string_view who) {
  return TimedOutError("the deadline passed " + std::string(what) + " (" + std::string(who) + ")");
}

std::string Errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

}  // namespace

// ---------------------------------------------------------------------------
// MemoryCoordinator

struct MemoryCoordinator::Shared {
  std::string name;
  bool fake_clock = false;
  Mutex mu;
  std::condition_variable cv;  // notified on every change and clock move
  CoordStore store RDMAPS_GUARDED_BY(mu);
  Nanos fake_now RDMAPS_GUARDED_BY(mu) = 0;

  Nanos Now() RDMAPS_REQUIRES(mu) { return fake_clock ? fake_now : MonotonicNow(); }
  // Expires what is due; wakes waiters when that changed anything.
  void ExpireLocked() RDMAPS_REQUIRES(mu) {
    if (store.Expire(Now())) cv.notify_all();
  }
};

namespace {

Mutex g_named_mu;
std::map<std::string, std::weak_ptr<MemoryCoordinator::Shared>>& NamedStores()
    RDMAPS_REQUIRES(g_named_mu) {
  static auto* stores = new std::map<std::string, std::weak_ptr<MemoryCoordinator::Shared>>();
  return *stores;
}

}  // namespace

std::unique_ptr<MemoryCoordinator> MemoryCoordinator::Open(const Options& options) {
  auto fresh = [&] {
    auto s = std::make_shared<Shared>();
    s->name = options.name;
    s->fake_clock = options.fake_clock;
    return s;
  };
  if (options.name.empty())
    return std::unique_ptr<MemoryCoordinator>(new MemoryCoordinator(fresh()));
  MutexLock lock(g_named_mu);
  auto& stores = NamedStores();
  for (auto it = stores.begin(); it != stores.end();) {  // forget dead stores
    it = it->second.expired() ? stores.erase(it) : std::next(it);
  }
  std::shared_ptr<Shared> s = stores[options.name].lock();
  if (!s) {
    s = fresh();
    stores[options.name] = s;
  }
  return std::unique_ptr<MemoryCoordinator>(new MemoryCoordinator(std::move(s)));
}

MemoryCoordinator::MemoryCoordinator(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
MemoryCoordinator::~MemoryCoordinator() = default;

std::unique_ptr<MemoryCoordinator> MemoryCoordinator::Share() const {
  return std::unique_ptr<MemoryCoordinator>(new MemoryCoordinator(shared_));
}

void MemoryCoordinator::TEST_AdvanceClock(std::chrono::nanoseconds by) {
  MutexLock lock(shared_->mu);
  shared_->fake_now += by.count();
  shared_->ExpireLocked();
  shared_->cv.notify_all();
}

std::string MemoryCoordinator::Describe() const {
  return "embedded (memory:" + shared_->name + ")";
}

Result<LeaseGrant> MemoryCoordinator::GrantLease(std::chrono::milliseconds ttl, CoordDeadline) {
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  return shared_->store.Grant(ttl, shared_->Now());
}

Status MemoryCoordinator::KeepAlive(LeaseId lease, CoordDeadline) {
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  return shared_->store.KeepAlive(lease, shared_->Now());
}

Status MemoryCoordinator::RevokeLease(LeaseId lease, CoordDeadline) {
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  shared_->store.Revoke(lease);
  shared_->cv.notify_all();
  return Status();
}

Result<ReadResult> MemoryCoordinator::Get(std::string_view key, CoordDeadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  return shared_->store.Get(key);
}

Result<ListResult> MemoryCoordinator::List(std::string_view prefix, CoordDeadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(prefix, /*allow_empty_prefix=*/true));
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  return shared_->store.List(prefix);
}

Result<CasResult> MemoryCoordinator::CompareAndSwap(std::string_view key,
                                                    std::int64_t expected_mod_revision,
                                                    std::string_view value, LeaseId lease,
                                                    CoordDeadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  RDMAPS_RETURN_IF_ERROR(CheckCoordValue(value));
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  auto r = shared_->store.CompareAndSwap(key, expected_mod_revision, value, lease);
  if (r.ok() && r->swapped) shared_->cv.notify_all();
  return r;
}

Status MemoryCoordinator::Delete(std::string_view key, CoordDeadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  MutexLock lock(shared_->mu);
  shared_->ExpireLocked();
  shared_->store.Delete(key);
  shared_->cv.notify_all();
  return Status();
}

Result<std::int64_t> MemoryCoordinator::WaitForChange(std::string_view key, bool prefix,
                                                      std::int64_t after_revision,
                                                      CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key, /*allow_empty_prefix=*/prefix));
  MutexLock lock(shared_->mu);
  for (;;) {
    shared_->ExpireLocked();
    const std::int64_t last = shared_->store.LastChange(key, prefix);
    if (last > after_revision) return last;
    const auto now = CoordClock::now();
    if (now >= deadline) {
      return DeadlinePassed("waiting for '" + std::string(key) + "' to change after revision " +
                                std::to_string(after_revision),
                            Describe());
    }
    CoordDeadline wake = deadline;
    if (!shared_->fake_clock) {
      if (auto next = shared_->store.NextExpiry()) wake = std::min(wake, FromNanos(*next));
    }
    shared_->cv.wait_until(lock.native(), wake);
  }
}

// ---------------------------------------------------------------------------
// DirectoryCoordinator

namespace {

constexpr std::size_t kMaxStateFileBytes = std::size_t{64} << 20;

std::string ReadBootId() {
  Fd fd(::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "";
  char buf[64];
  const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
  if (n <= 0) return "";
  std::string id(buf, static_cast<std::size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

Status CheckPrivateDir(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return IOError("coordinator directory " + path + ": " + Errno(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return PermissionDeniedError("coordinator directory " + path +
                                 " is not a directory (a symlink or file?); name a directory of "
                                 "your own, or a path that does not exist yet");
  }
  if (st.st_uid != ::geteuid()) {
    return PermissionDeniedError("coordinator directory " + path + " belongs to uid " +
                                 std::to_string(st.st_uid) + ", not to this user (" +
                                 std::to_string(::geteuid()) + "); use a directory of your own");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return PermissionDeniedError("coordinator directory " + path + " has mode " + mode +
                                 ": other users could change the job's decisions; run `chmod "
                                 "700 " +
                                 path + "`");
  }
  return Status();
}

}  // namespace

struct DirectoryCoordinator::State {
  std::string path;
  std::string boot_id;
  Fd lock_fd;  // constant after Open; flock()ed around every transaction
  Mutex mu;    // flock is per open file: threads of this handle take mu too

  // Lock, read, apply `fn` (true: it changed the store), write back if
  // anything changed, unlock. The lock is held for microseconds by any
  // holder, so it is polled until the deadline rather than waited for.
  Status Transaction(CoordDeadline deadline,
                     const std::function<Status(CoordStore&, Nanos, bool*)>& fn)
      RDMAPS_EXCLUDES(mu) {
    MutexLock lock(mu);
    auto pause = std::chrono::microseconds(50);
    while (::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        return IOError("flock(" + path + "/lock): " + Errno(errno));
      }
      if (CoordClock::now() >= deadline) {
        return DeadlinePassed("waiting for the lock of the coordinator directory " + path,
                              "another process holds it; if none of the job is running, "
                              "the file system does not support flock");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    Status s = Locked(fn);
    ::flock(lock_fd.get(), LOCK_UN);
    return s;
  }

  Status Locked(const std::function<Status(CoordStore&, Nanos, bool*)>& fn) {
    const std::string state_path = path + "/state";
    std::string bytes;
    Fd fd(::open(state_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.valid()) {
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        return IOError("coordinator state " + state_path + " is not a regular file");
      }
      if (static_cast<std::uint64_t>(st.st_size) > kMaxStateFileBytes) {
        return InvalidArgumentError("coordinator state " + state_path + " holds " +
                                    std::to_string(st.st_size) +
                                    " bytes, more than any valid "
                                    "state; remove the directory when no job uses it");
      }
      bytes.resize(static_cast<std::size_t>(st.st_size));
      std::size_t got = 0;
      while (got < bytes.size()) {
        const ssize_t n = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return IOError("read(" + state_path + "): " + Errno(n < 0 ? errno : EIO));
        got += static_cast<std::size_t>(n);
      }
    } else if (errno != ENOENT) {
      return IOError("open(" + state_path + "): " + Errno(errno));
    }
    const Nanos now = MonotonicNow();
    RDMAPS_ASSIGN_OR_RETURN(CoordStore store, ParseCoordStore(bytes, boot_id, now));
    bool changed = store.Expire(now);
    bool fn_changed = false;
    Status fs = fn(store, now, &fn_changed);
    if (changed || (fs.ok() && fn_changed)) {
      RDMAPS_RETURN_IF_ERROR(Write(store.EncodeWithBoot(boot_id)));
    }
    return fs;
  }

  Status Write(const std::string& bytes) {
    const std::string tmp = path + "/state.tmp";  // only the lock holder writes it
    ::unlink(tmp.c_str());
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) return IOError("create " + tmp + ": " + Errno(errno));
    std::size_t put = 0;
    while (put < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + put, bytes.size() - put);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return IOError("write(" + tmp + "): " + Errno(n < 0 ? errno : EIO));
      put += static_cast<std::size_t>(n);
    }
    fd.Reset();
    if (::rename(tmp.c_str(), (path + "/state").c_str()) != 0) {
      return IOError("rename(" + tmp + "): " + Errno(errno));
    }
    return Status();
  }
};

Result<std::unique_ptr<DirectoryCoordinator>> DirectoryCoordinator::Open(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return InvalidArgumentError("coordinator directory '" + path +
                                "' is not an absolute path; write dir:/some/dir");
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return IOError("cannot create the coordinator directory " + path + ": " + Errno(errno));
  }
  RDMAPS_RETURN_IF_ERROR(CheckPrivateDir(path));
  auto state = std::make_unique<State>();
  state->path = path;
  state->boot_id = ReadBootId();
  const std::string lock_path = path + "/lock";
  state->lock_fd.Reset(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!state->lock_fd.valid()) return IOError("open(" + lock_path + "): " + Errno(errno));
  return std::unique_ptr<DirectoryCoordinator>(new DirectoryCoordinator(std::move(state)));
}

DirectoryCoordinator::DirectoryCoordinator(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
DirectoryCoordinator::~DirectoryCoordinator() = default;

std::string DirectoryCoordinator::Describe() const { return "embedded (dir:" + state_->path + ")"; }

Result<LeaseGrant> DirectoryCoordinator::GrantLease(std::chrono::milliseconds ttl,
                                                    CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckLeaseTtl(ttl));
  LeaseGrant grant;
  RDMAPS_RETURN_IF_ERROR(
      state_->Transaction(deadline, [&](CoordStore& s, Nanos now, bool* changed) -> Status {
        RDMAPS_ASSIGN_OR_RETURN(grant, s.Grant(ttl, now));
        *changed = true;
        return Status();
      }));
  return grant;
}

Status DirectoryCoordinator::KeepAlive(LeaseId lease, CoordDeadline deadline) {
  return state_->Transaction(deadline, [&](CoordStore& s, Nanos now, bool* changed) {
    Status st = s.KeepAlive(lease, now);
    *changed = st.ok();
    return st;
  });
}

Status DirectoryCoordinator::RevokeLease(LeaseId lease, CoordDeadline deadline) {
  return state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool* changed) {
    s.Revoke(lease);
    *changed = true;
    return Status();
  });
}

Result<ReadResult> DirectoryCoordinator::Get(std::string_view key, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  ReadResult r;
  RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) {
    r = s.Get(key);
    return Status();
  }));
  return r;
}

Result<ListResult> DirectoryCoordinator::List(std::string_view prefix, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(prefix, /*allow_empty_prefix=*/true));
  ListResult r;
  RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) -> Status {
    RDMAPS_ASSIGN_OR_RETURN(r, s.List(prefix));
    return Status();
  }));
  return r;
}

Result<CasResult> DirectoryCoordinator::CompareAndSwap(std::string_view key,
                                                       std::int64_t expected_mod_revision,
                                                       std::string_view value, LeaseId lease,
                                                       CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  RDMAPS_RETURN_IF_ERROR(CheckCoordValue(value));
  CasResult r;
  RDMAPS_RETURN_IF_ERROR(
      state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool* changed) -> Status {
        RDMAPS_ASSIGN_OR_RETURN(r, s.CompareAndSwap(key, expected_mod_revision, value, lease));
        *changed = r.swapped;
        return Status();
      }));
  return r;
}

Status DirectoryCoordinator::Delete(std::string_view key, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  return state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool* changed) {
    const std::int64_t before = s.revision();
    s.Delete(key);
    *changed = s.revision() != before;
    return Status();
  });
}

Result<std::int64_t> DirectoryCoordinator::WaitForChange(std::string_view key, bool prefix,
                                                         std::int64_t after_revision,
                                                         CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key, /*allow_empty_prefix=*/prefix));
  // Watch the directory before the first read, so no rename is missed
  // between a read and the wait.
  Fd notify(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (notify.valid() &&
      ::inotify_add_watch(notify.get(), state_->path.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    notify.Reset();
  }
  for (;;) {
    std::int64_t last = 0;
    std::optional<Nanos> next_expiry;
    RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) {
      last = s.LastChange(key, prefix);
      next_expiry = s.NextExpiry();
      return Status();
    }));
    if (last > after_revision) return last;
    const auto now = CoordClock::now();
    if (now >= deadline) {
      return DeadlinePassed("waiting for '" + std::string(key) + "' to change after revision " +
                                std::to_string(after_revision),
                            Describe());
    }
    // Wake at the deadline, at the next lease expiry (nobody writes the file
    // when a lease runs out), and at least every 100 ms (inotify missing).
    CoordDeadline wake = std::min(deadline, now + std::chrono::milliseconds(100));
    if (next_expiry) wake = std::min(wake, FromNanos(*next_expiry));
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (notify.valid()) {
      pollfd p{notify.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(wait_ms, 0)));
      char buf[4096];
      while (::read(notify.get(), buf, sizeof(buf)) > 0) {
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::int64_t>(wait_ms, 10)));
    }
  }
}

}  // namespace rdmaps::internal
