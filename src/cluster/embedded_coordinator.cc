#include "src/cluster/embedded_coordinator.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <vector>

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
//
// The store's history is a chain of generation files in PATH, each written
// once and never changed:
//   g.<N>     generation N (N = 1, 2, ...): kGenMagic, N and the store
//             (CoordStore::EncodeWithBoot);
//   tmp/      a writer's next generation while it is being written, and
//             the links that turn old generations into tombstones;
//   z.<K>     an empty file: every g.<N> older than the newest
//             kKeptGenerations is replaced (rename) by a hard link to one,
//             so the name of every generation ever made exists for as long
//             as the directory does.
// The head is the highest N with a g.<N>; since every name from g.1 up
// exists, it is found by name lookups alone (from the last head this handle
// saw: one failed lookup when nothing changed, a galloping search else),
// never by listing a directory that others change. An operation reads the
// head, runs on its store and, when that changed anything (the operation
// itself, or leases that expired), commits generation N+1 with
// link(tmp/<x>, g.<N+1>), which fails when another writer committed N+1
// first: the loser reads the new head and runs again. A name is never freed,
// so a writer that was stopped for any time between its read and its link
// can never create a generation that existed before (the ABA problem a
// removed name would have). There is no lock: a process stopped anywhere
// (SIGSTOP) delays only its own call; the others commit past it, and it
// loses its race when it resumes.
// Cost: a directory entry (~32 bytes) per change that stays, and up to
// kKeptGenerations whole states.

namespace {

constexpr std::size_t kMaxStateFileBytes = std::size_t{64} << 20;
constexpr char kGenMagic[8] = {'R', 'D', 'M', 'A', 'P', 'S', 'G', '1'};
constexpr std::int64_t kKeptGenerations = 16;
// Generations that share one tombstone inode (ext4 allows 65000 links).
constexpr std::int64_t kGenerationsPerTombstone = 32768;
// A temporary file this old belongs to a writer that died (or was stopped
// for that long: its link then fails and it runs again); swept every
// kSweepEvery generations.
constexpr std::chrono::seconds kStaleTempAge{60};
constexpr std::int64_t kSweepEvery = 1024;

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

std::uint64_t NewToken() {
  std::uint64_t t = 0;
  if (::getrandom(&t, sizeof(t), 0) != static_cast<ssize_t>(sizeof(t))) {
    // (No getrandom: the clock and the pid name one writer's file well
    // enough; O_EXCL catches the rest.)
    t = static_cast<std::uint64_t>(MonotonicNow()) ^ (static_cast<std::uint64_t>(::getpid()) << 40);
  }
  return t;
}

void PutU64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t GetU64(std::string_view b) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
  return v;
}

Status WriteNewFile(const std::string& file, std::string_view bytes) {
  Fd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return IOError("create " + file + ": " + Errno(errno));
  std::size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + put, bytes.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::unlink(file.c_str());
      return IOError("write(" + file + "): " + Errno(err));
    }
    put += static_cast<std::size_t>(n);
  }
  return Status();
}

}  // namespace

struct DirectoryCoordinator::State {
  // Constant after Open.
  std::string path;
  std::string prefix;
  std::string boot_id;
  std::function<void(std::string_view)> hook;  // TEST_SetCommitHook
  // The newest head this handle saw (a hint: every g.<N> up to it exists).
  mutable std::atomic<std::int64_t> seen_head{0};

  using Fn = std::function<Status(CoordStore&, Nanos, bool*)>;

  std::string GenPath(std::int64_t n) const { return path + "/g." + std::to_string(n); }

  // Whether the name g.<n> exists (a live generation or a tombstone).
  Result<bool> Exists(std::int64_t n) const {
    struct stat st {};
    if (::lstat(GenPath(n).c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return IOError("stat(" + GenPath(n) + "): " + Errno(errno));
  }

  // The head now: g.<head> exists and g.<head+1> did not when looked up
  // last (0: no generation yet). Names from g.1 up all exist, so the
  // existence of g.<n> falls from true to false exactly once.
  Result<std::int64_t> FindHead() const {
    std::int64_t lo = seen_head.load(std::memory_order_relaxed);  // exists (or 0)
    std::int64_t step = 1;
    std::int64_t hi = 0;  // does not exist
    for (;;) {
      if (lo > std::numeric_limits<std::int64_t>::max() / 2) {
        return InternalError("coordinator directory " + path + " has too many generations");
      }
      RDMAPS_ASSIGN_OR_RETURN(bool e, Exists(lo + step));
      if (!e) {
        hi = lo + step;
        break;
      }
      lo += step;
      step *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      RDMAPS_ASSIGN_OR_RETURN(bool e, Exists(mid));
      (e ? lo : hi) = mid;
    }
    // (hi was looked up absent last, after lo was found: lo is the head.)
    std::int64_t seen = seen_head.load(std::memory_order_relaxed);
    while (seen < lo && !seen_head.compare_exchange_weak(seen, lo, std::memory_order_relaxed)) {
    }
    return lo;
  }

  // The store of generation n; NotFound when it is a tombstone already (a
  // newer head exists).
  Result<std::string> ReadGeneration(std::int64_t n) const {
    const std::string file = GenPath(n);
    Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return IOError("open(" + file + "): " + Errno(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return IOError("coordinator state " + file + " is not a regular file");
    }
    if (st.st_size == 0) return NotFoundError(file + " is an old generation");
    if (static_cast<std::uint64_t>(st.st_size) > kMaxStateFileBytes) {
      return InvalidArgumentError("coordinator state " + file + " holds " +
                                  std::to_string(st.st_size) +
                                  " bytes, more than any valid state; remove the directory "
                                  "when no job uses it");
    }
    std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t r = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return IOError("read(" + file + "): " + Errno(r < 0 ? errno : EIO));
      got += static_cast<std::size_t>(r);
    }
    if (bytes.size() < sizeof(kGenMagic) + 8 ||
        std::memcmp(bytes.data(), kGenMagic, sizeof(kGenMagic)) != 0 ||
        GetU64(std::string_view(bytes).substr(sizeof(kGenMagic))) !=
            static_cast<std::uint64_t>(n)) {
      return InvalidArgumentError("coordinator state " + file +
                                  " is corrupt (bad magic or generation); it is not written by "
                                  "this rdmaps version or was damaged: stop the job and remove "
                                  "the coordinator directory");
    }
    bytes.erase(0, sizeof(kGenMagic) + 8);
    return bytes;
  }

  void Hook(std::string_view point) const {
    if (hook) hook(point);
  }

  // Reads the head, applies `fn` (true: it changed the store) and commits
  // the result as the next generation when anything changed; runs again
  // when another writer committed first. Never waits for another process.
  Status Transaction(CoordDeadline deadline, const Fn& fn) const {
    int lost = 0;
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      if (CoordClock::now() >= deadline) {
        return DeadlinePassed("in a transaction on the coordinator directory " + path +
                                  " (lost the race to other writers " + std::to_string(lost) +
                                  " times); raise the call's deadline",
                              "embedded (dir:" + path + ")");
      }
      RDMAPS_ASSIGN_OR_RETURN(std::int64_t head, FindHead());
      std::string bytes;
      if (head != 0) {
        Result<std::string> g = ReadGeneration(head);
        if (!g.ok() && g.status().code() == StatusCode::kNotFound) {
          ++lost;  // a tombstone already: there is a newer head
          continue;
        }
        if (!g.ok()) return g.status();
        bytes = std::move(*g);
      }
      const Nanos now = MonotonicNow();
      RDMAPS_ASSIGN_OR_RETURN(CoordStore store, ParseCoordStore(bytes, boot_id, now));
      const bool expired = store.Expire(now);
      bool fn_changed = false;
      Status fs = fn(store, now, &fn_changed);
      if (!expired && !(fs.ok() && fn_changed)) return fs;  // read only
      RDMAPS_ASSIGN_OR_RETURN(bool committed, Commit(head + 1, store.EncodeWithBoot(boot_id)));
      if (committed) return fs;
      ++lost;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Links generation `next`. False: another writer committed it first.
  Result<bool> Commit(std::int64_t next, std::string_view store) const {
    std::string bytes(kGenMagic, sizeof(kGenMagic));
    PutU64(bytes, static_cast<std::uint64_t>(next));
    bytes.append(store);
    char name[32];
    std::snprintf(name, sizeof(name), "/tmp/%016llx", static_cast<unsigned long long>(NewToken()));
    const std::string tmp = path + name;
    RDMAPS_RETURN_IF_ERROR(WriteNewFile(tmp, bytes));
    Hook("before-link");
    const std::string file = GenPath(next);
    const int rc = ::link(tmp.c_str(), file.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rc != 0) {
      // EEXIST: another writer won. ENOENT: this writer was stopped so long
      // that its temporary file was swept.
      if (err == EEXIST || err == ENOENT) return false;
      return IOError("link(" + tmp + ", " + file + "): " + Errno(err));
    }
    Hook("after-link");
    std::int64_t seen = seen_head.load(std::memory_order_relaxed);
    while (seen < next && !seen_head.compare_exchange_weak(seen, next, std::memory_order_relaxed)) {
    }
    Retire(next - kKeptGenerations);
    if (next % kSweepEvery == 0) SweepTemps();
    return true;
  }

  // Replaces g.<n> by a tombstone, keeping its name (best effort: a
  // generation left whole only costs space).
  void Retire(std::int64_t n) const {
    if (n < 1) return;
    const std::string tomb = path + "/z." + std::to_string(n / kGenerationsPerTombstone);
    Fd made(::open(tomb.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!made.valid()) return;
    char name[32];
    std::snprintf(name, sizeof(name), "/tmp/%016llx", static_cast<unsigned long long>(NewToken()));
    const std::string tmp = path + name;
    if (::link(tomb.c_str(), tmp.c_str()) != 0) return;
    if (::rename(tmp.c_str(), GenPath(n).c_str()) != 0) ::unlink(tmp.c_str());
  }

  void SweepTemps() const {
    const std::string dir = path + "/tmp";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    const auto now = std::chrono::system_clock::now();
    int seen = 0;
    while (dirent* e = ::readdir(d)) {
      if (++seen > 4096) break;  // the rest next time
      if (e->d_name[0] == '.') continue;
      const std::string file = dir + "/" + e->d_name;
      struct stat st {};
      if (::lstat(file.c_str(), &st) != 0) continue;
      const auto mtime = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(st.st_mtim.tv_sec) +
              std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
      if (now - mtime > kStaleTempAge) ::unlink(file.c_str());
    }
    ::closedir(d);
  }

  // The stored key of a caller's key (InvalidArgument for a bad one).
  Result<std::string> Key(std::string_view key, bool allow_empty_prefix) const {
    RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key, allow_empty_prefix));
    return prefix + std::string(key);
  }
  void Strip(KeyValue& kv) const { kv.key.erase(0, prefix.size()); }
  void Strip(std::optional<KeyValue>& kv) const {
    if (kv) Strip(*kv);
  }
};

namespace {

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

Result<std::unique_ptr<DirectoryCoordinator>> DirectoryCoordinator::Open(
    const std::string& path, const std::string& job_prefix) {
  if (path.empty() || path[0] != '/') {
    return InvalidArgumentError("coordinator directory '" + path +
                                "' is not an absolute path; write dir:/some/dir");
  }
  if (!job_prefix.empty()) {
    if (Status s = CheckCoordKey(job_prefix); !s.ok()) {
      return InvalidArgumentError("coordinator job prefix '" + job_prefix.substr(0, 64) +
                                  "': " + s.message() +
                                  "; set RDMAPS_COORDINATOR_PREFIX to "
                                  "one of [A-Za-z0-9/_.:-], e.g. rdmaps/job-42/");
    }
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return IOError("cannot create the coordinator directory " + path + ": " + Errno(errno));
  }
  RDMAPS_RETURN_IF_ERROR(CheckPrivateDir(path));
  const std::string tmp = path + "/tmp";
  if (::mkdir(tmp.c_str(), 0700) != 0 && errno != EEXIST) {
    return IOError("cannot create " + tmp + ": " + Errno(errno));
  }
  RDMAPS_RETURN_IF_ERROR(CheckPrivateDir(tmp));
  auto state = std::make_unique<State>();
  state->path = path;
  state->prefix = job_prefix;
  state->boot_id = ReadBootId();
  return std::unique_ptr<DirectoryCoordinator>(new DirectoryCoordinator(std::move(state)));
}

DirectoryCoordinator::DirectoryCoordinator(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
DirectoryCoordinator::~DirectoryCoordinator() = default;

void DirectoryCoordinator::TEST_SetCommitHook(std::function<void(std::string_view point)> hook) {
  state_->hook = std::move(hook);
}

std::string DirectoryCoordinator::Describe() const {
  return "embedded (dir:" + state_->path +
         (state_->prefix.empty() ? "" : ", prefix " + state_->prefix) + ")";
}

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
  RDMAPS_ASSIGN_OR_RETURN(std::string k, state_->Key(key, false));
  ReadResult r;
  RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) {
    r = s.Get(k);
    return Status();
  }));
  state_->Strip(r.kv);
  return r;
}

Result<ListResult> DirectoryCoordinator::List(std::string_view prefix, CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(std::string p, state_->Key(prefix, true));
  ListResult r;
  RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) -> Status {
    RDMAPS_ASSIGN_OR_RETURN(r, s.List(p));
    return Status();
  }));
  for (KeyValue& kv : r.kvs) state_->Strip(kv);
  return r;
}

Result<CasResult> DirectoryCoordinator::CompareAndSwap(std::string_view key,
                                                       std::int64_t expected_mod_revision,
                                                       std::string_view value, LeaseId lease,
                                                       CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(std::string k, state_->Key(key, false));
  RDMAPS_RETURN_IF_ERROR(CheckCoordValue(value));
  CasResult r;
  RDMAPS_RETURN_IF_ERROR(
      state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool* changed) -> Status {
        RDMAPS_ASSIGN_OR_RETURN(r, s.CompareAndSwap(k, expected_mod_revision, value, lease));
        *changed = r.swapped;
        return Status();
      }));
  state_->Strip(r.current);
  return r;
}

Status DirectoryCoordinator::Delete(std::string_view key, CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(std::string k, state_->Key(key, false));
  return state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool* changed) {
    const std::int64_t before = s.revision();
    s.Delete(k);
    *changed = s.revision() != before;
    return Status();
  });
}

Result<std::int64_t> DirectoryCoordinator::WaitForChange(std::string_view key, bool prefix,
                                                         std::int64_t after_revision,
                                                         CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(std::string k, state_->Key(key, prefix));
  // Watch the directory before the first read, so no new generation is
  // missed between a read and the wait.
  Fd notify(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (notify.valid() &&
      ::inotify_add_watch(notify.get(), state_->path.c_str(), IN_CREATE | IN_MOVED_TO) < 0) {
    notify.Reset();
  }
  for (;;) {
    std::int64_t last = 0;
    std::optional<Nanos> next_expiry;
    RDMAPS_RETURN_IF_ERROR(state_->Transaction(deadline, [&](CoordStore& s, Nanos, bool*) {
      last = s.LastChange(k, prefix);
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
    // Wake at the deadline, at the next lease expiry (nobody writes when a
    // lease runs out), and at least every 100 ms (inotify missing).
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
