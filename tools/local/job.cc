#include "tools/local/job.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace rdmaps::local {

struct Job::Child {
  std::string name;
  bool server = false;
  bool replicated = false;
  pid_t pid = -1;
  Fd out_fd;    // merged stdout+stderr
  Fd ready_fd;  // ready_pipe: fd 3 of the child
  std::string out_buf, ready_buf;
  std::optional<int> exit_code;
  bool signaled = false;  // killed by a signal, not exited
  std::string how;
};

namespace {

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (name ? name : std::to_string(WTERMSIG(status)));
  }
  return "status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

sigset_t JobSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  return mask;
}

void WriteToStdout(const std::string& line) {
  std::string s = line + "\n";
  fwrite(s.data(), 1, s.size(), stdout);
  fflush(stdout);
}

}  // namespace

Result<std::unique_ptr<Job>> Job::Create(JobOptions options) {
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  struct sigaction old_int = {}, old_term = {};
  sigaction(SIGINT, &dfl, &old_int);
  sigaction(SIGTERM, &dfl, &old_term);
  const sigset_t mask = JobSignals();
  sigset_t old_mask;
  sigprocmask(SIG_BLOCK, &mask, &old_mask);
  const int fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    return ErrnoError("signalfd", err);
  }
  if (!options.sink) options.sink = WriteToStdout;
  return std::unique_ptr<Job>(new Job(std::move(options), fd, old_mask, old_int, old_term));
}

Job::Job(JobOptions options, int signal_fd, sigset_t old_mask, struct sigaction old_int,
         struct sigaction old_term)
    : options_(std::move(options)),
      signal_fd_(signal_fd),
      old_mask_(old_mask),
      old_int_(old_int),
      old_term_(old_term) {}

Job::~Job() {
  for (auto& c : children_) {
    if (!c->exit_code) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, nullptr, 0);
    }
  }
  // Signals that arrived after the last WaitUntil were the Job's to handle;
  // discard them rather than act on them once unblocked.
  signalfd_siginfo si;
  while (read(signal_fd_.get(), &si, sizeof(si)) == sizeof(si)) {
  }
  signal_fd_.Reset();  // before the mask is restored: nothing is queued for it then
  sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

Result<Job::ChildId> Job::Spawn(const ChildSpec& spec) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  Fd out_read(p[0]), out_write(p[1]);
  Fd ready_read, ready_write;
  if (spec.ready_pipe) {
    if (pipe2(p, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
    ready_read.Reset(p[0]);
    ready_write.Reset(p[1]);
  }
  const int out_w = out_write.get(), ready_w = ready_write.get();
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv = spec.argv;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out_w, 1);
    dup2(out_w, 2);
    if (spec.ready_pipe) dup2(ready_w, 3);  // dup2 clears O_CLOEXEC on the new fd
    execvpe(args[0], args.data(), envp.data());
    const char* why = std::strerror(errno);
    for (const char* part : {"cannot exec ", static_cast<const char*>(args[0]), ": ", why, "\n"}) {
      (void)!write(2, part, std::strlen(part));
    }
    _exit(127);
  }
  out_write.Reset();  // the child's end
  ready_write.Reset();
  auto c = std::make_unique<Child>();
  c->name = spec.name;
  c->server = spec.server;
  c->replicated = spec.replicated;
  c->pid = pid;
  c->out_fd = std::move(out_read);
  fcntl(c->out_fd.get(), F_SETFL, O_NONBLOCK);
  if (spec.ready_pipe) {
    c->ready_fd = std::move(ready_read);
    fcntl(c->ready_fd.get(), F_SETFL, O_NONBLOCK);
  }
  children_.push_back(std::move(c));
  return children_.size() - 1;
}

Job::Wake Job::WaitUntil(Clock::time_point deadline, const std::function<bool()>& done) {
  while (true) {
    if (done()) return {Wake::kDone, 0};
    if (Clock::now() >= deadline) return {Wake::kDeadline, 0};
    if (int sig = Pump(deadline)) return {Wake::kSignal, sig};
  }
}

int Job::Pump(Clock::time_point until) {
  std::vector<pollfd> pfds{{signal_fd_.get(), POLLIN, 0}};
  std::vector<std::pair<Child*, int>> owners;
  for (auto& c : children_) {
    for (int fd : {c->out_fd.get(), c->ready_fd.get()}) {
      if (fd >= 0) {
        pfds.push_back({fd, POLLIN, 0});
        owners.push_back({c.get(), fd});
      }
    }
  }
  // At most 500 ms, so that a lost SIGCHLD delays a reap by no more.
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  const int r = poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<long long>(ms, 0, 500)));
  int sig = 0;
  if (r > 0) {
    for (std::size_t k = 1; k < pfds.size(); ++k) {
      if (pfds[k].revents) Drain(*owners[k - 1].first, owners[k - 1].second);
    }
    if (pfds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(signal_fd_.get(), &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo != SIGCHLD) sig = static_cast<int>(si.ssi_signo);
      }
    }
  }
  Reap();
  return sig;
}

void Job::Reap() {
  auto cause_of = [](const Child& c) {
    constexpr int kServerExitWorkersDied = 4;
    if (c.server && *c.exit_code != kServerExitWorkersDied) return Cause::kServerDied;
    return c.signaled && !c.server ? Cause::kSignaled : Cause::kExited;
  };
  Child* first = nullptr;
  for (auto& owned : children_) {
    Child& c = *owned;
    if (c.exit_code) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    // Collect its last words before reporting the exit.
    if (c.out_fd.valid()) Drain(c, c.out_fd.get());
    c.exit_code = ExitCodeOf(status);
    c.signaled = WIFSIGNALED(status);
    c.how = Describe(status);
    Say(c.name + " (pid " + std::to_string(c.pid) + ") " + c.how +
        (c.replicated && c.exit_code != 0 && !stopping_
             ? " (a copy of a replicated shard: the other copy serves it)"
             : ""));
    if (c.replicated) continue;
    if (c.exit_code != 0 && (!first || cause_of(c) > cause_of(*first))) first = &c;
  }
  if (!first || stopping_) return;
  // Within kSettle of the first failure a likelier cause replaces it.
  const Cause cause = cause_of(*first);
  const bool replace = failure_ && cause > failure_->cause && Clock::now() < failure_->at + kSettle;
  if (!failure_ || replace) {
    const Clock::time_point at = replace ? failure_->at : Clock::now();
    failure_ = Failure{*first->exit_code, first->name + " " + first->how, first->server, cause, at};
  }
}

void Job::Drain(Child& c, int fd) {
  char buf[8192];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      (fd == c.out_fd.get() ? c.out_buf : c.ready_buf).append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      (fd == c.out_fd.get() ? c.out_fd : c.ready_fd).Reset();
    }
    break;
  }
  if (fd == c.out_fd.get() || !c.out_fd.valid()) FlushLines(c, !c.out_fd.valid());
}

void Job::FlushLines(Child& c, bool all) {
  std::size_t start = 0;
  while (true) {
    const auto nl = c.out_buf.find('\n', start);
    if (nl == std::string::npos) break;
    Emit("[" + c.name + "] " + c.out_buf.substr(start, nl - start));
    start = nl + 1;
  }
  c.out_buf.erase(0, start);
  if (all && !c.out_buf.empty()) {
    Emit("[" + c.name + "] " + c.out_buf);
    c.out_buf.clear();
  }
}

void Job::Signal(ChildId id, int sig) {
  Child& c = *children_[id];
  if (!c.exit_code) kill(c.pid, sig);
}

void Job::KillAndForget(const std::vector<ChildId>& ids) {
  for (ChildId id : ids) {
    Child& c = *children_[id];
    if (!c.exit_code) kill(c.pid, SIGKILL);
  }
  auto reaped = [&] {
    for (ChildId id : ids) {
      if (!children_[id]->exit_code) return false;
    }
    return true;
  };
  const auto give_up = Clock::now() + kKillWait;
  while (WaitUntil(give_up, reaped).reason == Wake::kSignal) {
  }
  failure_.reset();
}

void Job::StopAll(int sig) {
  stopping_ = true;
  for (auto& c : children_) {
    if (!c->exit_code) kill(c->pid, sig);
  }
  auto all_reaped = [this] { return Live() == 0; };
  // Signals that arrive meanwhile are dropped: every child is being stopped.
  const auto kill_at = Clock::now() + options_.grace;
  while (WaitUntil(kill_at, all_reaped).reason == Wake::kSignal) {
  }
  for (auto& c : children_) {
    if (!c->exit_code) {
      Say(c->name + " did not exit within " + std::to_string(options_.grace.count()) +
          " s of SIGTERM; SIGKILL");
      kill(c->pid, SIGKILL);
    }
  }
  const auto give_up = Clock::now() + kKillWait;
  while (WaitUntil(give_up, all_reaped).reason == Wake::kSignal) {
  }
  for (auto& c : children_) {
    for (int fd : {c->out_fd.get(), c->ready_fd.get()}) {
      if (fd >= 0) Drain(*c, fd);
    }
    FlushLines(*c, true);
  }
}

int Job::StopForSignal(int sig) {
  Say(std::string("received SIG") + sigabbrev_np(sig) + "; stopping every process");
  StopAll(sig == SIGHUP ? SIGTERM : sig);
  return 128 + sig;
}

void Job::Say(const std::string& line) { Emit("[" + options_.name + "] " + line); }

void Job::Emit(const std::string& line) { options_.sink(line); }

const std::string& Job::name(ChildId id) const { return children_.at(id)->name; }
pid_t Job::pid(ChildId id) const { return children_.at(id)->pid; }
std::optional<int> Job::exit_code(ChildId id) const { return children_.at(id)->exit_code; }
const std::string& Job::how(ChildId id) const { return children_.at(id)->how; }

std::optional<std::string> Job::ready_line(ChildId id) const {
  const std::string& buf = children_.at(id)->ready_buf;
  const auto nl = buf.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  return buf.substr(0, nl);
}

int Job::Live() const {
  int n = 0;
  for (const auto& c : children_) n += c->exit_code ? 0 : 1;
  return n;
}

}  // namespace rdmaps::local
