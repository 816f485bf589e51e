#include "src/cluster/secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "src/base/fd.h"
#include "src/base/log.h"
#include "src/base/secret.h"

namespace rdmaps::internal {
namespace {

constexpr std::size_t kMaxSecretBytes = 1024;  // transport::kMaxJobTokenBytes

const std::string* Get(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

std::string Errno(int err) { return std::strerror(err); }

// A descriptor's file must be regular, ours and private.
Status CheckPrivate(int fd, const std::string& path, const char* what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IOError("fstat(" + path + "): " + Errno(errno));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(std::string(what) + " " + path + " is not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    return PermissionDeniedError(std::string(what) + " " + path + " belongs to uid " +
                                 std::to_string(st.st_uid) + ", not to this user (uid " +
                                 std::to_string(::geteuid()) + "); use a file of your own");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return PermissionDeniedError(std::string(what) + " " + path + " has mode " + mode +
                                 ": group or others may read it; run `chmod 600 " + path + "`");
  }
  return Status::OK();
}

Result<std::string> ReadAll(int fd, const std::string& path, std::size_t max) {
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IOError("read(" + path + "): " + Errno(errno));
    }
    if (r == 0) break;
    out.append(buf, static_cast<std::size_t>(r));
    if (out.size() > max) {
      return InvalidArgumentError(path + " holds more than " + std::to_string(max) + " bytes");
    }
  }
  return out;
}

// mkdir -p for the key's directory: the last component 0700 (and checked),
// missing parents 0700 too.
Status MakePrivateDir(const std::string& dir) {
  if (dir.empty()) return Status::OK();
  std::size_t pos = 0;
  while ((pos = dir.find('/', pos + 1)) != std::string::npos) {
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      return IOError("mkdir(" + part + "): " + Errno(errno));
    }
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return IOError("mkdir(" + dir + "): " + Errno(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return IOError("stat(" + dir + "): " + Errno(errno));
  if (st.st_uid == ::geteuid() && (st.st_mode & 022) != 0) {
    return PermissionDeniedError("directory " + dir +
                                 " of the rdmaps key is writable by group or others; run "
                                 "`chmod 700 " +
                                 dir + "`");
  }
  return Status::OK();
}

}  // namespace

std::string UserKeyPath(const Environment& env) {
  if (const auto* p = Get(env, "RDMAPS_KEY_FILE")) return *p;
  if (const auto* x = Get(env, "XDG_CONFIG_HOME")) return *x + "/rdmaps/key";
  if (const auto* h = Get(env, "HOME")) return *h + "/.config/rdmaps/key";
  return "";
}

Result<std::string> ReadSecretFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    return NotFoundError("RDMAPS_JOB_SECRET_FILE=" + path + " cannot be opened: " + Errno(errno) +
                         "; point it at the file the server wrote");
  }
  RDMAPS_RETURN_IF_ERROR(CheckPrivate(fd.get(), path, "job secret file"));
  RDMAPS_ASSIGN_OR_RETURN(std::string s, ReadAll(fd.get(), path, kMaxSecretBytes + 1));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) return InvalidArgumentError("job secret file " + path + " is empty");
  if (s.size() > kMaxSecretBytes) {
    return InvalidArgumentError("job secret file " + path + " holds more than " +
                                std::to_string(kMaxSecretBytes) + " bytes");
  }
  return s;
}

Status WriteSecretFile(const std::string& path, const std::string& secret) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    RDMAPS_RETURN_IF_ERROR(MakePrivateDir(path.substr(0, slash)));
  }
  ::unlink(path.c_str());  // an older file of ours; O_EXCL refuses anything planted since
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid())
    return IOError("cannot create the job secret file " + path + ": " + Errno(errno));
  const std::string line = secret + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return IOError("write(" + path + "): " + Errno(errno));
  }
  return Status::OK();
}

Result<std::array<std::uint8_t, 32>> LoadOrCreateUserKey(const std::string& path) {
  std::array<std::uint8_t, 32> key{};
  auto read_existing = [&](int fd) -> Status {
    RDMAPS_RETURN_IF_ERROR(CheckPrivate(fd, path, "rdmaps key file"));
    RDMAPS_ASSIGN_OR_RETURN(std::string bytes, ReadAll(fd, path, 64));
    if (bytes.size() != key.size()) {
      return InvalidArgumentError("rdmaps key file " + path + " has " +
                                  std::to_string(bytes.size()) +
                                  " bytes, not 32; delete it to have a new one made (running "
                                  "jobs of yours then need restarting)");
    }
    std::memcpy(key.data(), bytes.data(), key.size());
    return Status::OK();
  };
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.valid()) {
    RDMAPS_RETURN_IF_ERROR(read_existing(fd.get()));
    return key;
  }
  if (errno != ENOENT) return IOError("open(" + path + "): " + Errno(errno));
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    RDMAPS_RETURN_IF_ERROR(MakePrivateDir(path.substr(0, slash)));
  }
  // Write a complete private temporary file, then link it into place: a
  // concurrent rank either links first or finds the finished key.
  std::array<std::uint8_t, 8> r;
  RandomBytes(r);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + HexOf(r);
  std::array<std::uint8_t, 32> fresh;
  RandomBytes(fresh);
  {
    Fd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!t.valid()) return IOError("cannot create " + tmp + ": " + Errno(errno));
    if (::write(t.get(), fresh.data(), fresh.size()) != static_cast<ssize_t>(fresh.size()) ||
        ::fsync(t.get()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return IOError("write(" + tmp + "): " + Errno(err));
    }
  }
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (linked == 0) {
    RDMAPS_LOG(INFO) << "rdmaps: created the per-user key " << path;
    return fresh;
  }
  if (err != EEXIST) return IOError("link(" + tmp + ", " + path + "): " + Errno(err));
  Fd again(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!again.valid()) return IOError("open(" + path + "): " + Errno(errno));
  RDMAPS_RETURN_IF_ERROR(read_existing(again.get()));
  return key;
}

bool LauncherJobIdentity(const Environment& env, std::string* kind, std::string* identity) {
  // Innermost launcher first, as resolve.cc recognises them.
  if (const auto* run = Get(env, "TORCHELASTIC_RUN_ID")) {
    const auto* addr = Get(env, "MASTER_ADDR");
    const auto* port = Get(env, "MASTER_PORT");
    if (addr && port) {
      *kind = "torchrun";
      *identity = "run " + *run + " master " + *addr + ":" + *port;
      return true;
    }
  }
  if (const auto* ns = Get(env, "PMIX_NAMESPACE")) {
    *kind = "Open MPI";
    *identity = "pmix " + *ns;
    return true;
  }
  if (const auto* j = Get(env, "OMPI_MCA_ess_base_jobid")) {
    *kind = "Open MPI";
    *identity = "jobid " + *j + " " +
                (Get(env, "OMPI_MCA_orte_hnp_uri") ? *Get(env, "OMPI_MCA_orte_hnp_uri") : "");
    return true;
  }
  if (Get(env, "PMI_RANK") && Get(env, "PMI_PORT")) {
    *kind = "MPICH";
    *identity = "pmi " + *Get(env, "PMI_PORT");
    return true;
  }
  if (const auto* j = Get(env, "SLURM_JOB_ID")) {
    const auto* step = Get(env, "SLURM_STEP_ID");
    *kind = "Slurm";
    *identity = "job " + *j + " step " + (step ? *step : std::string("batch"));
    return true;
  }
  if (const auto* tf = Get(env, "TF_CONFIG")) {
    auto j = nlohmann::json::parse(*tf, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("cluster")) {
      *kind = "TF_CONFIG";
      std::string spec = j["cluster"].dump();  // keys sorted: the same in every task
      Mac h = MacBuilder(SecretKey::FromSecret("")).Add(spec).Finish();
      *identity = "cluster " + HexOf(h);
      return true;
    }
  }
  if (const auto* uri = Get(env, "DMLC_PS_ROOT_URI")) {
    const auto* port = Get(env, "DMLC_PS_ROOT_PORT");
    *kind = "DMLC";
    *identity = "root " + *uri + ":" + (port ? *port : std::string());
    return true;
  }
  return false;
}

Result<JobSecret> ResolveJobSecret(const ClusterOptions& options, const Environment& env,
                                   const ClusterLayout& layout) {
  JobSecret s;
  const auto* insecure = Get(env, "RDMAPS_INSECURE");
  if (options.insecure || (insecure && *insecure != "0")) {
    s.insecure = true;
    s.source = options.insecure ? "options (insecure)" : "RDMAPS_INSECURE";
    RDMAPS_LOG(WARNING) << "rdmaps: running WITHOUT a job secret (" << s.source
                        << "): anyone who can reach this job's ports can read and overwrite "
                           "its parameters or stop it";
    return s;
  }
  if (!options.job_token.empty()) {
    s.value = options.job_token;
    s.source = "options";
    return s;
  }
  if (const auto* f = Get(env, "RDMAPS_JOB_SECRET_FILE")) {
    RDMAPS_ASSIGN_OR_RETURN(s.value, ReadSecretFile(*f));
    s.source = "RDMAPS_JOB_SECRET_FILE=" + *f;
    return s;
  }
  for (const char* name : {"RDMAPS_JOB_SECRET", "RDMAPS_JOB_TOKEN"}) {
    if (const auto* v = Get(env, name)) {
      if (v->size() > kMaxSecretBytes) {
        return InvalidArgumentError(std::string(name) + " has " + std::to_string(v->size()) +
                                    " bytes; at most " + std::to_string(kMaxSecretBytes));
      }
      s.value = *v;
      s.source = name;
      return s;
    }
  }
  std::string kind, identity;
  if (!LauncherJobIdentity(env, &kind, &identity)) {
    // A rank-based launcher without a job id of its own (MPICH's hydra
    // hands local ranks PMI_FD, not PMI_PORT): the ranks of one job still
    // share their rendezvous address, which the derivation below binds.
    if (!layout.needs_rendezvous || layout.rendezvous.empty()) {
      s.source = "none (no launcher job to derive one from)";
      return s;
    }
    kind = layout.source;
    identity = "rendezvous only";
  }
  const std::string path = UserKeyPath(env);
  if (path.empty()) {
    s.source = "none (no HOME for the per-user key)";
    return s;
  }
  RDMAPS_ASSIGN_OR_RETURN(auto key_bytes, LoadOrCreateUserKey(path));
  // The key file's bytes are the secret behind SecretKey.
  const SecretKey key = SecretKey::FromSecret(
      std::string_view(reinterpret_cast<const char*>(key_bytes.data()), key_bytes.size()));
  Mac m = MacBuilder(key)
              .Add(std::string_view("rdmaps job v1"))
              .Add(kind)
              .Add(identity)
              .Add(layout.rendezvous)
              .Finish();
  s.value = HexOf(m);
  s.source = "derived from " + kind + " " + identity + " and " + path;
  return s;
}

}  // namespace rdmaps::internal

namespace rdmaps {

std::string GenerateJobSecret() { return RandomSecretHex(); }

Status WriteJobSecretFile(const std::string& path, const std::string& secret) {
  return internal::WriteSecretFile(path, secret);
}

std::string DefaultJobSecretFile(const Environment& env, int pid) {
  auto get = [&](const char* n) -> const std::string* {
    auto it = env.find(n);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  std::string dir;
  if (const auto* r = get("XDG_RUNTIME_DIR")) {
    dir = *r + "/rdmaps";
  } else if (const auto* x = get("XDG_CONFIG_HOME")) {
    dir = *x + "/rdmaps";
  } else if (const auto* h = get("HOME")) {
    dir = *h + "/.config/rdmaps";
  } else {
    return "";
  }
  return dir + "/job-secret-" + std::to_string(pid);
}

}  // namespace rdmaps
