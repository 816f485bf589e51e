// The Coordinator on a real etcd v3 (Debian 12: etcd-server 3.4), through
// its gRPC gateway's JSON API over plain HTTP/1.1 (or HTTPS) with libcurl:
//
//   POST /v3/kv/range        Get, List (key + range_end), bounded by limit
//   POST /v3/kv/txn          CompareAndSwap: compare MOD(key) == expected,
//                            success put (with lease), failure range
//   POST /v3/kv/deleterange  Delete
//   POST /v3/lease/grant     GrantLease (TTL in whole seconds, rounded up)
//   POST /v3/lease/keepalive KeepAlive: one request, one streamed result; a
//                            result without TTL means the lease is gone
//   POST /v3/lease/revoke    RevokeLease
//   POST /v3/watch           WaitForChange: create_request from
//                            after_revision + 1; the first event (or a
//                            compaction notice) ends the call
//   POST /v3/auth/authenticate  with etcd_user: its token is sent in the
//                            Authorization header of every call
// Keys and values are base64 in this API; int64 fields are decimal strings.
// Every key is prefixed with the job prefix, so jobs share an etcd.
//
// Every reply is hostile: bodies are bounded (kMaxEtcdReplyBytes), parsed
// with the depth- and size-limited JSON parser, every field is type-checked,
// base64 is decoded strictly, a key outside the job prefix or a value over
// the coordinator's limits is refused (DataLoss: "etcd returned ..."). The
// reply parsers below are pure functions (unit tests, fuzzing).
//
// Errors: a refused or reset connection or a 5xx is Unavailable naming the
// endpoint and how to check it (`etcdctl --endpoints=... endpoint health`);
// the next endpoint is tried only when the request cannot have reached etcd
// (connection refused, host not found), so a CAS is never sent twice. A
// call past its deadline is TimedOut. etcd's own errors map from their gRPC
// code (NotFound for "requested lease not found", PermissionDenied for
// authentication).
//
// Thread safety: safe for concurrent use; each call takes a libcurl handle
// of its own from a pool (connections are reused).
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/cluster/coordinator.h"

namespace rdmaps::internal {

inline constexpr std::size_t kMaxEtcdReplyBytes = std::size_t{4} << 20;

struct EtcdOptions {
  std::vector<std::string> endpoints;        // "http://127.0.0.1:2379", tried in order
  std::string prefix;                        // the job prefix, prepended to every key
  std::string user, password;                // password authentication when user is set
  std::string ca_file, cert_file, key_file;  // TLS (https endpoints)
  std::chrono::milliseconds connect_timeout{1000};
};

// The etcd part of CoordinatorOptions: "etcd://h:p,h:p" (http) or
// "etcd+https://h:p" (TLS); the password read from etcd_password_file
// (which must be private to this user).
Result<EtcdOptions> ParseEtcdOptions(const CoordinatorOptions& options);

class EtcdCoordinator : public Coordinator {
 public:
  // Authenticates when options.user is set; does not contact etcd otherwise
  // (the first call does; Unavailable then if it is not there).
  static Result<std::unique_ptr<EtcdCoordinator>> Open(const EtcdOptions& options);
  ~EtcdCoordinator() override;

  std::string Describe() const override;
  Result<LeaseGrant> GrantLease(std::chrono::milliseconds ttl, CoordDeadline deadline) override;
  Status KeepAlive(LeaseId lease, CoordDeadline deadline) override;
  Status RevokeLease(LeaseId lease, CoordDeadline deadline) override;
  Result<ReadResult> Get(std::string_view key, CoordDeadline deadline) override;
  Result<ListResult> List(std::string_view prefix, CoordDeadline deadline) override;
  Result<CasResult> CompareAndSwap(std::string_view key, std::int64_t expected_mod_revision,
                                   std::string_view value, LeaseId lease,
                                   CoordDeadline deadline) override;
  Status Delete(std::string_view key, CoordDeadline deadline) override;
  Result<std::int64_t> WaitForChange(std::string_view key, bool prefix, std::int64_t after_revision,
                                     CoordDeadline deadline) override;

  struct Impl;

 private:
  explicit EtcdCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- Pure parsers of etcd's replies (exposed for tests and fuzzing) --------

// The JSON object of a reply body; an etcd error object ({"error", "code",
// "message"}, or {"error": {"grpc_code", "message"}} inside a stream) as
// the Status its gRPC code maps to.
Result<nlohmann::json> ParseEtcdReply(std::string_view body);
// An int64 field: absent = 0 (proto3 JSON omits defaults), else a decimal
// string or an integer; DataLoss for anything else.
Result<std::int64_t> EtcdInt(const nlohmann::json& object, std::string_view field);
// A kv object with its key's job prefix removed.
Result<KeyValue> ParseEtcdKv(const nlohmann::json& kv, std::string_view prefix);
// /v3/kv/range's reply.
Result<ListResult> ParseEtcdRange(const nlohmann::json& reply, std::string_view prefix);
// /v3/kv/txn's reply to CompareAndSwap.
Result<CasResult> ParseEtcdCas(const nlohmann::json& reply, std::string_view prefix);
// One message of /v3/watch's stream: the revision it reports a change at
// (> 0), 0 when it reports none (the "created" message, progress).
Result<std::int64_t> ParseEtcdWatchMessage(const nlohmann::json& message,
                                           std::int64_t after_revision);

// Strict standard base64 (with padding) both ways.
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text, std::size_t max_bytes);

}  // namespace rdmaps::internal
