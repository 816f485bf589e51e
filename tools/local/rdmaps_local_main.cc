// rdmaps-local: a whole rdmaps job on this machine.
//
//   rdmaps-local --servers 2 --workers 3 -- ./my_worker --epochs=2
//
// The flags fill a LaunchOptions; launch.h describes the run, phase by phase
// (tables, servers, their addresses, workers, supervision, tear-down), and
// job.h the supervisor of the child processes: their output, exits and
// signals. Exit code: the first failing child's (a signal N counts as
// 128+N), 2 for bad flags or tables, 124 past a deadline, else 0.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <stdlib.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tools/common/exit.h"
#include "tools/common/flags.h"
#include "tools/local/launch.h"

DEFINE_int32(servers, 1, "parameter servers to start");
DEFINE_int32(workers, 1, "workers to start (each runs the command after --)");
DEFINE_string(transport, "auto", "tcp, verbs or auto (verbs when a usable device exists)");
DEFINE_string(host, "127.0.0.1",
              "address servers listen on (for verbs/Soft-RoCE: the RDMA netdev's IP)");
DEFINE_string(tables, "", "the job's tables as JSON; default: ask the worker command");
DEFINE_string(layout_env, "rdmaps",
              "how workers get their layout: rdmaps (RDMAPS_* variables) or tf_config");
DEFINE_string(server_binary, "", "rdmaps-server to run (default: next to rdmaps-local)");
DEFINE_string(server_args, "", "extra flags for every rdmaps-server, space-separated");
DEFINE_bool(insecure, false,
            "run the job without a secret (its children get RDMAPS_INSECURE=1; default: a "
            "random secret per run, passed to them in RDMAPS_JOB_SECRET)");
DEFINE_int32(startup_timeout_s, 60, "deadline for servers to be ready and workers to connect");
DEFINE_int32(timeout_s, 0, "deadline for the whole job (exit 124); 0: none");
DEFINE_int32(grace_s, 10, "after SIGTERM, children get this long before SIGKILL");
DEFINE_int32(restart_servers, 0,
             "when a server dies, restart every server from the latest checkpoint (--restore=auto; "
             "give --checkpoint_dir in --server_args) up to this many times; the workers must "
             "reconnect (rdmaps-train --max_recoveries)");
DEFINE_int32(omit_worker, -1, "fault drill: do not start this worker (its slot stays empty)");
DEFINE_int32(replicas, 1,
             "copies of each shard: 2 starts a backup and a primary per shard (rdmaps-server "
             "--replicas=2); a server that dies is replaced by its shard's other copy");
DEFINE_int32(max_replacements, 4,
             "with --replicas=2: when a copy of a shard dies, start a replacement backup that "
             "copies the shard from the survivor while training goes on (re-protection), at "
             "most this many over the job; 0: none (the shard stays with one copy)");
DEFINE_bool(print_layout, false, "print the layout the workers would get and exit");
DEFINE_int32(max_workers, 0,
             "elastic mode: servers keep slots for this many workers, who may join and leave "
             "the running job (docs/ps.md \"Elastic workers\"); workers see it as "
             "RDMAPS_NUM_WORKERS. 0: a fixed set of --workers");
DEFINE_int32(join_workers, 0,
             "elastic mode: start this many more workers (ids --workers, ...) --join_after_s "
             "into the run; they join at the members' clock");
DEFINE_int32(join_after_s, 0, "when the --join_workers start, in seconds after the first ones");

namespace {

// Splits argv at the first "--": what follows is the worker command.
std::vector<std::string> TakeCommand(int* argc, char** argv) {
  std::vector<std::string> command;
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      command.assign(argv + i + 1, argv + *argc);
      *argc = i;
      break;
    }
  }
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  rdmaps::local::LaunchOptions options;
  options.command = TakeCommand(&argc, argv);
  // With TZ unset glibc re-reads the zone (and frees/strdups its name) on
  // every localtime call glog makes per log line; naming the system zone
  // once makes that a no-op (and keeps TSan from flagging glibc's
  // internally locked tzset). Before any thread starts.
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  gflags::SetUsageMessage(
      "starts a whole rdmaps job on this machine\n"
      "  rdmaps-local --servers N --workers M -- <worker command...>");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  options.servers = FLAGS_servers;
  options.workers = FLAGS_workers;
  options.transport = FLAGS_transport;
  options.host = FLAGS_host;
  options.tables = FLAGS_tables;
  options.layout_env = FLAGS_layout_env;
  options.server_binary = FLAGS_server_binary;
  options.server_args = FLAGS_server_args;
  options.insecure = FLAGS_insecure;
  options.restart_servers = FLAGS_restart_servers;
  options.startup_timeout = std::chrono::seconds(FLAGS_startup_timeout_s);
  options.timeout = std::chrono::seconds(FLAGS_timeout_s);
  options.grace = std::chrono::seconds(FLAGS_grace_s);
  options.omit_worker = FLAGS_omit_worker;
  options.max_workers = FLAGS_max_workers;
  options.join_workers = FLAGS_join_workers;
  options.join_after = std::chrono::seconds(FLAGS_join_after_s);
  options.replicas = FLAGS_replicas;
  options.max_replacements = FLAGS_max_replacements;
  options.print_layout = FLAGS_print_layout;
  // No exception reaches std::terminate (tools/common/exit.h).
  return rdmaps::tools::GuardedMain("rdmaps-local", [&] { return rdmaps::local::Launch(options); });
}
