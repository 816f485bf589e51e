// Where a job's secret comes from (docs/security.md), in order:
//   1. ClusterOptions::insecure or RDMAPS_INSECURE=1: no secret (the
//      transport's well-known key), logged at WARNING.
//   2. ClusterOptions::job_token (an explicit option of the program).
//   3. RDMAPS_JOB_SECRET_FILE: a regular file, not readable by group or
//      others (refused otherwise, with the chmod that fixes it).
//   4. RDMAPS_JOB_SECRET (RDMAPS_JOB_TOKEN, its old name): the value.
//      Never a command-line flag: `ps` shows every user the argv.
//   5. Derived: HMAC-SHA256(per-user key, "rdmaps job v1", launcher kind,
//      launcher job identity, rendezvous address), as hex. Every rank of one
//      job computes the same; another user (another key) or another job
//      (another identity) cannot. The per-user key is $RDMAPS_KEY_FILE or
//      ${XDG_CONFIG_HOME:-$HOME/.config}/rdmaps/key (LoadOrCreateUserKey).
//   6. None: the layout's job_token stays empty; a server started by hand
//      generates one (rdmaps-server writes it to a file), everything else
//      fails at Endpoint::Create naming these sources.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"

namespace rdmaps::internal {

struct JobSecret {
  std::string value;  // empty when insecure or none was found
  bool insecure = false;
  std::string source;  // "options", "RDMAPS_JOB_SECRET_FILE=...", "derived (Slurm ...)", ...
};

// The launcher's identity of this job, the same in every rank: "kind" and
// "identity" (e.g. "Slurm", "job 1234 step 0"); false when the environment
// names no launcher job (or too little of it).
bool LauncherJobIdentity(const Environment& env, std::string* kind, std::string* identity);

// Steps 1-5 above. PermissionDenied for a secret or key file others can
// read; InvalidArgument for an empty or oversized one.
Result<JobSecret> ResolveJobSecret(const ClusterOptions& options, const Environment& env,
                                   const ClusterLayout& layout);

// The 32-byte per-user key at `path`: read when it exists (a regular file of
// 32 bytes, owned by this user, mode 0600 or stricter), else created with
// O_CREAT|O_EXCL mode 0600 in a 0700 directory. Race-safe: the key is written
// to a private temporary file and link(2)ed into place, so ranks starting at
// once all end up with the one that was linked first.
Result<std::array<std::uint8_t, 32>> LoadOrCreateUserKey(const std::string& path);

// Reads a secret file (step 3's rules): its bytes, without a trailing newline.
Result<std::string> ReadSecretFile(const std::string& path);

// Writes `secret` to `path` (created 0600, replacing an older file of ours),
// for workers started by hand (rdmaps-server).
Status WriteSecretFile(const std::string& path, const std::string& secret);

// $RDMAPS_KEY_FILE, else ${XDG_CONFIG_HOME:-$HOME/.config}/rdmaps/key; empty
// when neither HOME nor XDG_CONFIG_HOME is set.
std::string UserKeyPath(const Environment& env);

}  // namespace rdmaps::internal
