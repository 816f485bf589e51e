// A Job: the child processes of rdmaps-local, their output, their exits and
// the signals sent to the launcher - everything rdmaps-local supervises, and
// nothing of what the children are (launch.h decides that).
//
//   RDMAPS_ASSIGN_OR_RETURN(auto job, Job::Create(JobOptions()));
//   RDMAPS_ASSIGN_OR_RETURN(auto id, job->Spawn({.name = "ps0", .argv = {...}, .env = env}));
//   auto wake = job->WaitUntil(deadline, [&] { return job->exit_code(id).has_value(); });
//   if (wake.reason == Job::Wake::kSignal) return job->StopForSignal(wake.signal);
//
// Every child gets its own process group (so a terminal's Ctrl-C reaches only
// the launcher, which forwards it) and dies with the launcher
// (PR_SET_PDEATHSIG). Its stdout and stderr are merged and emitted line by
// line with a prefix ("[ps0] ..."); the Job's own lines carry its name
// ("[rdmaps-local] ps0 (pid 12) exit 3"). A child's exit code is its exit
// status, or 128+N when signal N ended it.
//
// Signals: while a Job exists, SIGCHLD, SIGINT, SIGTERM and SIGHUP are
// blocked and read from a signalfd the Job owns, so no handler and no global
// is involved; WaitUntil reports SIGINT, SIGTERM and SIGHUP. The destructor
// restores the signal mask and the dispositions of SIGINT and SIGTERM.
//
// Thread safety: one thread uses a Job, the one that created it (the signal
// mask is that thread's). One Job per process at a time.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmaps/status.h"
#include "src/base/fd.h"

namespace rdmaps::local {

using Clock = std::chrono::steady_clock;

struct JobOptions {
  // Prefix of the Job's own lines: "[name] ...".
  std::string name = "rdmaps-local";
  // StopAll: how long children get after the first signal before SIGKILL.
  std::chrono::seconds grace{10};
  // Receives every line (without its newline): children's prefixed output
  // and the Job's own messages. Default: stdout, flushed per line.
  std::function<void(const std::string& line)> sink;
};

// One child to start.
struct ChildSpec {
  // Prefix of its output lines: "[name] ...".
  std::string name;
  // argv[0] is looked up in PATH.
  std::vector<std::string> argv;
  // Its whole environment.
  std::map<std::string, std::string> env;
  // A server's failure is taken as the cause of workers' failures around it
  // (see Job::Cause and Job::kSettle).
  bool server = false;
  // One copy of a replicated shard (rdmaps-local --replicas=2): its death is
  // said but is not the job's failure (the other copy takes over; when
  // both go, the workers fail and that is the failure).
  bool replicated = false;
  // Fd 3 of the child is a pipe to the Job; its first line is ready_line().
  bool ready_pipe = false;
};

class Job {
 public:
  using ChildId = std::size_t;

  // Why WaitUntil returned.
  struct Wake {
    enum Reason { kDone, kDeadline, kSignal };
    Reason reason = kDone;
    int signal = 0;  // kSignal: SIGINT, SIGTERM or SIGHUP
  };

  // How likely a failed child caused the failures around it, least first.
  enum class Cause {
    kExited,      // a worker (or rdmaps-server's "workers died", exit 4)
                  // that exited with an error: most often reporting
                  // another process's death
    kSignaled,    // a worker killed by a signal: killed from outside
    kServerDied,  // any other server failure: its workers fail with it
  };

  // The child most likely the cause, among those that failed (exit code
  // not 0) before StopAll was called.
  struct Failure {
    int exit_code = 0;
    std::string what;  // "worker1 killed by SIGKILL"
    bool server = false;
    Cause cause = Cause::kExited;
    Clock::time_point at;  // when the first failure of all was seen
  };

  // How long after the first failure a likelier cause still replaces it. A
  // dying process's sockets close before it can be reaped (the kernel
  // closes its files, then frees its memory, then reports its exit), so the
  // processes that fail because of it may be reaped first, on a loaded
  // machine by hundreds of milliseconds.
  static constexpr std::chrono::milliseconds kSettle{1000};

  // Takes SIGINT and SIGTERM back to their default action (a shell starts
  // background jobs with SIGINT ignored, and an ignored signal is discarded,
  // blocked or not), blocks the signals above and opens the signalfd.
  static Result<std::unique_ptr<Job>> Create(JobOptions options);

  // SIGKILLs and reaps the children still running, then restores the signal
  // mask and dispositions.
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // fork+exec with stdout+stderr on a pipe to the Job.
  Result<ChildId> Spawn(const ChildSpec& spec);

  // Streams output, reaps children and reads signals until `done()` holds
  // (kDone), `deadline` passes (kDeadline) or SIGINT/SIGTERM/SIGHUP arrives
  // (kSignal). `done` is checked first, so a condition that already holds
  // returns at once.
  Wake WaitUntil(Clock::time_point deadline, const std::function<bool()>& done);

  // Sends `sig` to every child still running, waits up to the grace period,
  // then SIGKILLs the rest (saying so) and waits up to kKillWait for them;
  // flushes every child's remaining output. Failures after this are no
  // longer recorded in failure().
  void StopAll(int sig = SIGTERM);

  // SIGKILLs the children of `ids` still running and waits (up to
  // kKillWait) until they are reaped; then forgets failure() (their exits
  // and the one that caused this are handled). For restarting some children.
  void KillAndForget(const std::vector<ChildId>& ids);

  // Sends `sig` to the child `id` if it still runs.
  void Signal(ChildId id, int sig);

  // "received SIGINT; stopping every process", StopAll (SIGHUP is forwarded
  // as SIGTERM); returns 128 + sig, the launcher's exit code.
  int StopForSignal(int sig);

  // A line of the Job's own: "[name] line".
  void Say(const std::string& line);

  const std::string& name(ChildId id) const;
  pid_t pid(ChildId id) const;
  // Once the child is reaped: its exit code and how it ended ("exit 3",
  // "killed by SIGKILL").
  std::optional<int> exit_code(ChildId id) const;
  const std::string& how(ChildId id) const;
  // A ready_pipe child's first line on fd 3, once it is complete.
  std::optional<std::string> ready_line(ChildId id) const;

  // Children not yet reaped.
  int Live() const;
  const std::optional<Failure>& failure() const { return failure_; }

 private:
  struct Child;

  Job(JobOptions options, int signal_fd, sigset_t old_mask, struct sigaction old_int,
      struct sigaction old_term);

  // One round: poll the pipes and the signalfd (at most until `until`), read
  // what is there, reap. Returns the signal received, or 0.
  int Pump(Clock::time_point until);
  void Reap();
  // Reads what is available on one of `c`'s pipes; closes it at EOF.
  void Drain(Child& c, int fd);
  // Emits c's complete lines; with `all`, the unterminated rest too.
  void FlushLines(Child& c, bool all);
  void Emit(const std::string& line);

  // How long StopAll waits for children after SIGKILL.
  static constexpr std::chrono::seconds kKillWait{5};

  // Constant after construction.
  const JobOptions options_;
  Fd signal_fd_;  // signalfd of SIGINT, SIGTERM, SIGHUP, SIGCHLD
  const sigset_t old_mask_;
  const struct sigaction old_int_;
  const struct sigaction old_term_;

  std::vector<std::unique_ptr<Child>> children_;
  std::optional<Failure> failure_;
  bool stopping_ = false;  // StopAll was called
};

}  // namespace rdmaps::local
