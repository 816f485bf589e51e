#include "src/cluster/etcd_coordinator.h"

#include <curl/curl.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "src/base/host_port.h"
#include "src/base/mutex.h"
#include "src/cluster/json_parse.h"
#include "src/cluster/secret.h"

namespace rdmaps::internal {
namespace {

using nlohmann::json;

Status Hostile(std::string_view what) {
  return DataLossError("etcd returned " + std::string(what) +
                       "; is the endpoint an etcd v3 server (etcd 3.4 or later)?");
}

// The gRPC status codes etcd's gateway reports, as ours.
Status FromGrpc(std::int64_t code, const std::string& message) {
  std::string msg = "etcd: " + message;
  // etcd reports some authentication failures as InvalidArgument.
  for (const char* auth : {"authentication failed", "user name is empty", "invalid auth token",
                           "permission denied", "user name not found"}) {
    if (message.find(auth) != std::string::npos) code = 16;
  }
  switch (code) {
    case 3:
    case 11:
      return InvalidArgumentError(msg);  // InvalidArgument, OutOfRange
    case 4:
      return TimedOutError(msg);
    case 5:
      return NotFoundError(msg);
    case 6:
      return AlreadyExistsError(msg);
    case 7:
    case 16:
      return PermissionDeniedError(msg +
                                   " (check etcd_user and etcd_password_file, or the "
                                   "client certificate)");
    case 8:
      return ResourceExhaustedError(msg);
    case 9:
      return FailedPreconditionError(msg);
    case 12:
      return NotSupportedError(msg);
    case 1:
      return CancelledError(msg);
    case 14:
    case 10:
      return UnavailableError(msg);
    default:
      return UnavailableError(msg + " (gRPC code " + std::to_string(code) + ")");
  }
}

// The smallest key after every key that starts with `prefix` (etcd's
// range_end of a prefix); "\0" (all keys from `prefix` on) when none.
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

std::string Dec(std::int64_t v) { return std::to_string(v); }

const json* Field(const json& o, std::string_view name) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(name);
  return it == o.end() ? nullptr : &*it;
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

Result<std::string> Base64Decode(std::string_view text, std::size_t max_bytes) {
  if (text.size() / 4 * 3 > max_bytes + 2) return Hostile("an oversized base64 field");
  std::string out(text.size() / 4 * 3 + 3, '\0');
  std::size_t len = 0;
  const char* end = nullptr;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(),
                        text.size(), nullptr, &len, &end, sodium_base64_VARIANT_ORIGINAL) != 0 ||
      end != text.data() + text.size()) {
    return Hostile("a field that is not valid base64");
  }
  if (len > max_bytes) return Hostile("an oversized base64 field");
  out.resize(len);
  return out;
}

Result<json> ParseEtcdReply(std::string_view body) {
  if (body.size() > kMaxEtcdReplyBytes) return Hostile("a reply over 4 MiB");
  auto parsed = ParseJsonLimited(body, "etcd reply");
  if (!parsed.ok()) return Hostile("a reply that is not JSON (" + parsed.status().message() + ")");
  json j = std::move(parsed).value();
  if (!j.is_object()) return Hostile("a reply that is not a JSON object");
  if (const json* err = Field(j, "error")) {
    // Unary: {"error": "...", "code": N, "message": "..."}; streams:
    // {"error": {"grpc_code": N, "http_code": M, "message": "..."}}.
    const json& src = err->is_object() ? *err : j;
    const json* code = Field(src, err->is_object() ? "grpc_code" : "code");
    const json* msg = Field(src, "message");
    std::int64_t c = 2;
    if (code && code->is_number_integer()) c = code->get<std::int64_t>();
    std::string m = msg && msg->is_string()
                        ? msg->get<std::string>()
                        : (err->is_string() ? err->get<std::string>() : "error");
    if (m.size() > 512) m.resize(512);
    return FromGrpc(c, m);
  }
  return j;
}

Result<std::int64_t> EtcdInt(const json& object, std::string_view field) {
  const json* f = Field(object, field);
  if (f == nullptr || f->is_null()) return std::int64_t{0};
  if (f->is_number_integer()) return f->get<std::int64_t>();
  if (!f->is_string()) return Hostile("a non-integer '" + std::string(field) + "'");
  const std::string& s = f->get_ref<const std::string&>();
  if (s.empty() || s.size() > 20) return Hostile("a bad integer in '" + std::string(field) + "'");
  std::size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return Hostile("a bad integer in '" + std::string(field) + "'");
  std::uint64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return Hostile("a bad integer in '" + std::string(field) + "'");
    const std::uint64_t d = static_cast<std::uint64_t>(s[i] - '0');
    if (v > (std::uint64_t{1} << 63) / 10) return Hostile("an integer out of range");
    v = v * 10 + d;
  }
  const bool neg = s[0] == '-';
  if ((!neg && v > static_cast<std::uint64_t>(INT64_MAX)) ||
      (neg && v > (std::uint64_t{1} << 63))) {
    return Hostile("an integer out of range in '" + std::string(field) + "'");
  }
  if (neg) return v == (std::uint64_t{1} << 63) ? INT64_MIN : -static_cast<std::int64_t>(v);
  return static_cast<std::int64_t>(v);
}

Result<KeyValue> ParseEtcdKv(const json& kv, std::string_view prefix) {
  if (!kv.is_object()) return Hostile("a kv that is not an object");
  const json* key = Field(kv, "key");
  if (key == nullptr || !key->is_string()) return Hostile("a kv without a key");
  RDMAPS_ASSIGN_OR_RETURN(std::string full, Base64Decode(key->get_ref<const std::string&>(),
                                                         prefix.size() + kMaxCoordKeyBytes));
  if (full.compare(0, prefix.size(), prefix) != 0 || full.size() < prefix.size()) {
    return Hostile("a key outside the job prefix");
  }
  KeyValue out;
  out.key = full.substr(prefix.size());
  if (!CheckCoordKey(out.key).ok()) return Hostile("a key that is not a valid coordinator key");
  if (const json* v = Field(kv, "value"); v != nullptr && !v->is_null()) {
    if (!v->is_string()) return Hostile("a value that is not a string");
    RDMAPS_ASSIGN_OR_RETURN(out.value,
                            Base64Decode(v->get_ref<const std::string&>(), kMaxCoordValueBytes));
  }
  RDMAPS_ASSIGN_OR_RETURN(out.create_revision, EtcdInt(kv, "create_revision"));
  RDMAPS_ASSIGN_OR_RETURN(out.mod_revision, EtcdInt(kv, "mod_revision"));
  RDMAPS_ASSIGN_OR_RETURN(out.lease, EtcdInt(kv, "lease"));
  if (out.mod_revision < 1 || out.create_revision < 0 || out.create_revision > out.mod_revision) {
    return Hostile("a kv with impossible revisions");
  }
  return out;
}

namespace {

Result<std::int64_t> HeaderRevision(const json& reply) {
  const json* h = Field(reply, "header");
  if (h == nullptr || !h->is_object()) return Hostile("a reply without a header");
  RDMAPS_ASSIGN_OR_RETURN(std::int64_t rev, EtcdInt(*h, "revision"));
  if (rev < 1) return Hostile("a header revision < 1");
  return rev;
}

Result<std::vector<KeyValue>> ParseKvs(const json& reply, std::string_view prefix) {
  std::vector<KeyValue> out;
  const json* kvs = Field(reply, "kvs");
  if (kvs == nullptr || kvs->is_null()) return out;
  if (!kvs->is_array()) return Hostile("'kvs' that is not an array");
  if (kvs->size() > kMaxCoordListKeys) return Hostile("more keys than asked for");
  for (const json& kv : *kvs) {
    RDMAPS_ASSIGN_OR_RETURN(KeyValue v, ParseEtcdKv(kv, prefix));
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

Result<ListResult> ParseEtcdRange(const json& reply, std::string_view prefix) {
  ListResult r;
  RDMAPS_ASSIGN_OR_RETURN(r.revision, HeaderRevision(reply));
  RDMAPS_ASSIGN_OR_RETURN(r.kvs, ParseKvs(reply, prefix));
  RDMAPS_ASSIGN_OR_RETURN(std::int64_t more, EtcdInt(reply, "count"));
  if (const json* m = Field(reply, "more"); m != nullptr && m->is_boolean() && m->get<bool>()) {
    more = INT64_MAX;
  }
  if (more > static_cast<std::int64_t>(r.kvs.size())) {
    return ResourceExhaustedError("more than " + std::to_string(kMaxCoordListKeys) +
                                  " keys under the prefix; list a narrower prefix");
  }
  for (const auto& kv : r.kvs) {
    if (kv.mod_revision > r.revision) return Hostile("a kv newer than its reply");
  }
  return r;
}

Result<CasResult> ParseEtcdCas(const json& reply, std::string_view prefix) {
  CasResult r;
  RDMAPS_ASSIGN_OR_RETURN(r.revision, HeaderRevision(reply));
  if (const json* s = Field(reply, "succeeded"); s != nullptr && !s->is_null()) {
    if (!s->is_boolean()) return Hostile("'succeeded' that is not a boolean");
    r.swapped = s->get<bool>();
  }
  if (r.swapped) return r;
  const json* responses = Field(reply, "responses");
  if (responses == nullptr || !responses->is_array() || responses->size() != 1) {
    return Hostile("a failed txn without its one range response");
  }
  const json* range = Field((*responses)[0], "response_range");
  if (range == nullptr) return Hostile("a failed txn whose response is not a range");
  RDMAPS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, ParseKvs(*range, prefix));
  if (kvs.size() > 1) return Hostile("a range of one key with several keys");
  if (!kvs.empty()) r.current = std::move(kvs[0]);
  return r;
}

Result<std::int64_t> ParseEtcdWatchMessage(const json& message, std::int64_t after_revision) {
  const json* result = Field(message, "result");
  if (result == nullptr || !result->is_object()) return Hostile("a watch message without result");
  if (const json* c = Field(*result, "canceled");
      c != nullptr && c->is_boolean() && c->get<bool>()) {
    RDMAPS_ASSIGN_OR_RETURN(std::int64_t compact, EtcdInt(*result, "compact_revision"));
    if (compact <= 0) {
      const json* reason = Field(*result, "cancel_reason");
      return UnavailableError("etcd canceled the watch: " +
                              (reason && reason->is_string()
                                   ? reason->get<std::string>().substr(0, 256)
                                   : std::string("no reason given")));
    }
    // The history from after_revision was compacted: report a change (the
    // caller re-reads), at least after_revision + 1.
    return std::max(compact, after_revision + 1);
  }
  const json* events = Field(*result, "events");
  if (events == nullptr || events->is_null()) return std::int64_t{0};
  if (!events->is_array()) return Hostile("watch events that are not an array");
  std::int64_t rev = 0;
  for (const json& ev : *events) {
    const json* kv = Field(ev, "kv");
    if (kv == nullptr) return Hostile("a watch event without kv");
    RDMAPS_ASSIGN_OR_RETURN(std::int64_t mod, EtcdInt(*kv, "mod_revision"));
    rev = std::max(rev, mod);
  }
  if (!events->empty() && rev <= after_revision) return Hostile("a watch event from the past");
  return rev;
}

Result<EtcdOptions> ParseEtcdOptions(const CoordinatorOptions& options) {
  EtcdOptions o;
  std::string_view rest = options.address;
  std::string scheme;
  if (rest.rfind("etcd://", 0) == 0) {
    scheme = "http://";
    rest.remove_prefix(7);
  } else if (rest.rfind("etcd+https://", 0) == 0) {
    scheme = "https://";
    rest.remove_prefix(13);
  } else {
    return InvalidArgumentError("'" + options.address + "' is not etcd://HOST:PORT[,...]");
  }
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view one = rest.substr(0, comma);
    RDMAPS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(one, "etcd endpoint"));
    if (hp.port == 0) {
      return InvalidArgumentError("etcd endpoint '" + std::string(one) + "' has port 0");
    }
    o.endpoints.push_back(scheme + JoinHostPort(hp.host, hp.port));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (o.endpoints.empty() || o.endpoints.size() > 16) {
    return InvalidArgumentError("'" + options.address + "' names " +
                                std::to_string(o.endpoints.size()) +
                                " etcd endpoints; name 1 to 16");
  }
  o.prefix = options.job_prefix;
  o.user = options.etcd_user;
  if (!o.user.empty()) {
    if (options.etcd_password_file.empty()) {
      return InvalidArgumentError("etcd_user '" + o.user +
                                  "' needs etcd_password_file (a file of mode 0600)");
    }
    RDMAPS_ASSIGN_OR_RETURN(o.password, ReadSecretFile(options.etcd_password_file));
  }
  o.ca_file = options.etcd_ca_file;
  o.cert_file = options.etcd_cert_file;
  o.key_file = options.etcd_key_file;
  if (scheme == "http://" && !(o.ca_file.empty() && o.cert_file.empty() && o.key_file.empty())) {
    return InvalidArgumentError(
        "TLS files were given for a plain-HTTP etcd address; write "
        "etcd+https://HOST:PORT");
  }
  return o;
}

// ---------------------------------------------------------------------------
// The HTTP side.

struct EtcdCoordinator::Impl {
  EtcdOptions options;  // constant after Open
  std::string describe;

  Mutex mu;
  std::vector<CURL*> idle RDMAPS_GUARDED_BY(mu);
  std::string token RDMAPS_GUARDED_BY(mu);
  std::size_t good_endpoint RDMAPS_GUARDED_BY(mu) = 0;

  ~Impl() {
    MutexLock lock(mu);
    for (CURL* c : idle) curl_easy_cleanup(c);
  }

  // A pooled handle, returned to the pool (or freed) when done.
  struct Handle {
    Handle(Impl* i, CURL* c) : impl(i), curl(c) {}
    Handle(Handle&& o) noexcept : impl(o.impl), curl(std::exchange(o.curl, nullptr)) {}
    Handle& operator=(Handle&&) = delete;
    Impl* impl;
    CURL* curl;
    ~Handle() {
      if (curl == nullptr) return;
      MutexLock lock(impl->mu);
      if (impl->idle.size() < 8) {
        impl->idle.push_back(curl);
      } else {
        curl_easy_cleanup(curl);
      }
    }
  };
  Result<Handle> Take() {
    CURL* c = nullptr;
    {
      MutexLock lock(mu);
      if (!idle.empty()) {
        c = idle.back();
        idle.pop_back();
      }
    }
    if (c != nullptr) return Handle(this, c);
    c = curl_easy_init();
    if (c == nullptr) return ResourceExhaustedError("curl_easy_init failed (out of memory?)");
    return Handle(this, c);
  }

  // Where the body of a reply goes: a bounded buffer, and for streams a
  // callback per complete line (false: stop the transfer).
  struct Sink {
    std::string buf;
    bool overflow = false;
    std::function<bool(std::string_view line)> on_line;  // streams only
    bool stopped = false;
  };
  static size_t OnData(char* data, size_t size, size_t n, void* user) {
    auto* sink = static_cast<Sink*>(user);
    const size_t bytes = size * n;
    if (sink->buf.size() + bytes > kMaxEtcdReplyBytes) {
      sink->overflow = true;
      return 0;
    }
    sink->buf.append(data, bytes);
    if (sink->on_line) {
      std::size_t nl;
      while ((nl = sink->buf.find('\n')) != std::string::npos) {
        std::string line = sink->buf.substr(0, nl);
        sink->buf.erase(0, nl + 1);
        if (!line.empty() && !sink->on_line(line)) {
          sink->stopped = true;
          return 0;
        }
      }
    }
    return bytes;
  }

  // POSTs `body` to `path` on the first endpoint that accepts a connection.
  // Returns the reply body (unary) or OK once on_line stopped the stream.
  Result<std::string> Post(const std::string& path, const std::string& body, CoordDeadline deadline,
                           Sink* stream = nullptr, bool authenticate = true) {
    RDMAPS_ASSIGN_OR_RETURN(Handle h, Take());
    std::size_t first;
    std::string auth;
    {
      MutexLock lock(mu);
      first = good_endpoint;
      if (authenticate && !token.empty()) auth = "Authorization: " + token;
    }
    Status last;
    for (std::size_t i = 0; i < options.endpoints.size(); ++i) {
      const std::size_t e = (first + i) % options.endpoints.size();
      const std::string& endpoint = options.endpoints[e];
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - CoordClock::now());
      if (left.count() <= 0) {
        return TimedOutError("the deadline passed before etcd at " + endpoint + " was asked " +
                             path);
      }
      Sink own;
      Sink* sink = stream ? stream : &own;
      sink->buf.clear();
      CURL* c = h.curl;
      curl_easy_reset(c);
      const std::string url = endpoint + path;
      curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
      if (!auth.empty()) headers = curl_slist_append(headers, auth.c_str());
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(std::max<std::int64_t>(left.count(), 1)));
      curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                       static_cast<long>(std::min(left, options.connect_timeout).count()));
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Impl::OnData);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
      curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(kMaxEtcdReplyBytes));
      if (!options.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options.ca_file.c_str());
      if (!options.cert_file.empty())
        curl_easy_setopt(c, CURLOPT_SSLCERT, options.cert_file.c_str());
      if (!options.key_file.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, options.key_file.c_str());
      char errbuf[CURL_ERROR_SIZE] = {0};
      curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
      const CURLcode rc = curl_easy_perform(c);
      long http = 0;
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
      curl_slist_free_all(headers);
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);
      const std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      if (rc == CURLE_WRITE_ERROR && sink->stopped) return std::string();
      if (rc == CURLE_WRITE_ERROR || rc == CURLE_FILESIZE_EXCEEDED || sink->overflow) {
        return Hostile("a reply over 4 MiB to " + path);
      }
      if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) {
        // The request did not leave: another endpoint may take it.
        last = UnavailableError("etcd at " + endpoint + " is unreachable (" + why +
                                "); check that it runs: etcdctl --endpoints=" + endpoint +
                                " endpoint health");
        continue;
      }
      if (rc == CURLE_OPERATION_TIMEDOUT) {
        // Connected (or answering) when the time ran out: the call's own
        // deadline passed (curl's timeout is `left`, truncated to whole
        // milliseconds, so the clock alone may read a hair before it).
        // Else the connect timeout: etcd did not accept the connection.
        curl_off_t connect_us = 0;
        curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
        if (connect_us > 0 || http != 0 ||
            CoordClock::now() >= deadline - std::chrono::milliseconds(2)) {
          return TimedOutError("the deadline passed waiting for etcd at " + endpoint + path);
        }
        return UnavailableError("etcd at " + endpoint + " did not accept a connection within " +
                                std::to_string(options.connect_timeout.count()) + " ms (" + why +
                                ")");
      }
      if (rc != CURLE_OK) {
        return UnavailableError("etcd at " + endpoint + " failed " + path + ": " + why +
                                " (curl error " + std::to_string(rc) + ")");
      }
      {
        MutexLock lock(mu);
        good_endpoint = e;
      }
      if (http != 200 && !stream) {
        // etcd's errors come as JSON with any status; anything else (a
        // proxy's page, an old etcd without this path) is named by status.
        auto err = ParseEtcdReply(sink->buf);
        if (!err.ok() && err.status().code() != StatusCode::kDataLoss) return err.status();
        return UnavailableError("etcd at " + endpoint + " answered HTTP " + std::to_string(http) +
                                " to " + path + "; is it etcd 3.4 or later with its gRPC gateway?");
      }
      return std::move(sink->buf);
    }
    return last;
  }

  // A unary call: Post, parse, and on an expired auth token authenticate
  // once more and retry.
  Result<json> Call(const std::string& path, const json& request, CoordDeadline deadline) {
    const std::string body = request.dump();
    for (int attempt = 0;; ++attempt) {
      RDMAPS_ASSIGN_OR_RETURN(std::string reply, Post(path, body, deadline));
      auto parsed = ParseEtcdReply(reply);
      if (!parsed.ok() && parsed.status().code() == StatusCode::kPermissionDenied &&
          !options.user.empty() && attempt == 0 &&
          parsed.status().message().find("token") != std::string::npos) {
        RDMAPS_RETURN_IF_ERROR(Authenticate(deadline));
        continue;
      }
      return parsed;
    }
  }

  Status Authenticate(CoordDeadline deadline) {
    json req = {{"name", options.user}, {"password", options.password}};
    RDMAPS_ASSIGN_OR_RETURN(std::string reply,
                            Post("/v3/auth/authenticate", req.dump(), deadline, nullptr, false));
    RDMAPS_ASSIGN_OR_RETURN(json j, ParseEtcdReply(reply));
    const json* t = Field(j, "token");
    if (t == nullptr || !t->is_string() || t->get_ref<const std::string&>().empty() ||
        t->get_ref<const std::string&>().size() > 4096) {
      return Hostile("an authentication reply without a token");
    }
    for (char ch : t->get_ref<const std::string&>()) {
      if (ch < 0x21 || ch > 0x7e) return Hostile("a token with bytes a header cannot carry");
    }
    MutexLock lock(mu);
    token = t->get<std::string>();
    return Status();
  }

  std::string Full(std::string_view key) const { return options.prefix + std::string(key); }
};

namespace {
void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}
}  // namespace

Result<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::Open(const EtcdOptions& options) {
  if (options.endpoints.empty()) return InvalidArgumentError("no etcd endpoint given");
  if (!options.prefix.empty()) RDMAPS_RETURN_IF_ERROR(CheckCoordKey(options.prefix));
  GlobalInit();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->describe = "etcd (";
  for (std::size_t i = 0; i < options.endpoints.size(); ++i) {
    impl->describe += (i ? "," : "") + options.endpoints[i];
  }
  impl->describe += ", prefix '" + options.prefix + "')";
  if (!options.user.empty()) {
    RDMAPS_RETURN_IF_ERROR(impl->Authenticate(CoordClock::now() + std::chrono::seconds(10)));
  }
  return std::unique_ptr<EtcdCoordinator>(new EtcdCoordinator(std::move(impl)));
}

EtcdCoordinator::EtcdCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdCoordinator::~EtcdCoordinator() = default;

std::string EtcdCoordinator::Describe() const { return impl_->describe; }

Result<LeaseGrant> EtcdCoordinator::GrantLease(std::chrono::milliseconds ttl,
                                               CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckLeaseTtl(ttl));
  const std::int64_t seconds = (ttl.count() + 999) / 1000;
  RDMAPS_ASSIGN_OR_RETURN(json j,
                          impl_->Call("/v3/lease/grant", {{"TTL", Dec(seconds)}}, deadline));
  RDMAPS_ASSIGN_OR_RETURN(std::int64_t id, EtcdInt(j, "ID"));
  RDMAPS_ASSIGN_OR_RETURN(std::int64_t granted, EtcdInt(j, "TTL"));
  if (id == kNoLease || granted < seconds || granted > kMaxLeaseTtl.count() / 1000 * 2) {
    return Hostile("a lease grant with ID " + Dec(id) + " and TTL " + Dec(granted));
  }
  return LeaseGrant{id, std::chrono::seconds(granted)};
}

Status EtcdCoordinator::KeepAlive(LeaseId lease, CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(json j,
                          impl_->Call("/v3/lease/keepalive", {{"ID", Dec(lease)}}, deadline));
  const json* result = Field(j, "result");
  if (result == nullptr || !result->is_object()) return Hostile("a keepalive without result");
  RDMAPS_ASSIGN_OR_RETURN(std::int64_t ttl, EtcdInt(*result, "TTL"));
  if (ttl <= 0) {
    return NotFoundError("lease " + Dec(lease) + " has expired or was revoked: its keys are gone");
  }
  return Status();
}

Status EtcdCoordinator::RevokeLease(LeaseId lease, CoordDeadline deadline) {
  auto r = impl_->Call("/v3/lease/revoke", {{"ID", Dec(lease)}}, deadline);
  if (!r.ok() && r.status().code() == StatusCode::kNotFound) return Status();
  return r.status();
}

Result<ReadResult> EtcdCoordinator::Get(std::string_view key, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  RDMAPS_ASSIGN_OR_RETURN(
      json j, impl_->Call("/v3/kv/range", {{"key", Base64Encode(impl_->Full(key))}}, deadline));
  RDMAPS_ASSIGN_OR_RETURN(ListResult l, ParseEtcdRange(j, impl_->options.prefix));
  if (l.kvs.size() > 1) return Hostile("several keys for one");
  ReadResult r;
  r.revision = l.revision;
  if (!l.kvs.empty()) {
    if (l.kvs[0].key != key) return Hostile("another key than the one asked for");
    r.kv = std::move(l.kvs[0]);
  }
  return r;
}

Result<ListResult> EtcdCoordinator::List(std::string_view prefix, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(prefix, /*allow_empty_prefix=*/true));
  const std::string full = impl_->Full(prefix);
  json req = {{"key", Base64Encode(full.empty() ? std::string(1, '\0') : full)},
              {"range_end", Base64Encode(PrefixEnd(full))},
              {"limit", Dec(kMaxCoordListKeys)}};
  RDMAPS_ASSIGN_OR_RETURN(json j, impl_->Call("/v3/kv/range", req, deadline));
  RDMAPS_ASSIGN_OR_RETURN(ListResult l, ParseEtcdRange(j, impl_->options.prefix));
  for (const auto& kv : l.kvs) {
    if (kv.key.compare(0, prefix.size(), prefix) != 0) return Hostile("a key outside the range");
  }
  return l;
}

Result<CasResult> EtcdCoordinator::CompareAndSwap(std::string_view key,
                                                  std::int64_t expected_mod_revision,
                                                  std::string_view value, LeaseId lease,
                                                  CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  RDMAPS_RETURN_IF_ERROR(CheckCoordValue(value));
  if (expected_mod_revision < 0) {
    return InvalidArgumentError("expected_mod_revision " + Dec(expected_mod_revision) + " < 0");
  }
  const std::string k = Base64Encode(impl_->Full(key));
  json put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease != kNoLease) put["lease"] = Dec(lease);
  json req = {{"compare", json::array({{{"target", "MOD"},
                                        {"key", k},
                                        {"result", "EQUAL"},
                                        {"mod_revision", Dec(expected_mod_revision)}}})},
              {"success", json::array({{{"request_put", put}}})},
              {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  RDMAPS_ASSIGN_OR_RETURN(json j, impl_->Call("/v3/kv/txn", req, deadline));
  RDMAPS_ASSIGN_OR_RETURN(CasResult r, ParseEtcdCas(j, impl_->options.prefix));
  if (r.current && r.current->key != key) return Hostile("another key than the one asked for");
  return r;
}

Status EtcdCoordinator::Delete(std::string_view key, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key));
  return impl_->Call("/v3/kv/deleterange", {{"key", Base64Encode(impl_->Full(key))}}, deadline)
      .status();
}

Result<std::int64_t> EtcdCoordinator::WaitForChange(std::string_view key, bool prefix,
                                                    std::int64_t after_revision,
                                                    CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckCoordKey(key, /*allow_empty_prefix=*/prefix));
  if (after_revision < 0 || after_revision == INT64_MAX) {
    return InvalidArgumentError("after_revision " + Dec(after_revision) + " out of range");
  }
  const std::string full = impl_->Full(key);
  json create = {{"key", Base64Encode(full.empty() ? std::string(1, '\0') : full)},
                 {"start_revision", Dec(after_revision + 1)}};
  if (prefix) create["range_end"] = Base64Encode(PrefixEnd(full));
  const std::string body = json{{"create_request", create}}.dump();
  Impl::Sink sink;
  std::int64_t changed = 0;
  Status failure;
  sink.on_line = [&](std::string_view line) {
    auto msg = ParseEtcdReply(line);
    if (!msg.ok()) {
      failure = msg.status();
      return false;
    }
    auto rev = ParseEtcdWatchMessage(*msg, after_revision);
    if (!rev.ok()) {
      failure = rev.status();
      return false;
    }
    if (*rev > 0) {
      changed = *rev;
      return false;
    }
    return true;
  };
  auto r = impl_->Post("/v3/watch", body, deadline, &sink);
  if (changed > 0) return changed;
  if (!failure.ok()) return failure;
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kTimedOut) {
      return TimedOutError("the deadline passed waiting for '" + std::string(key) +
                           "' to change after revision " + Dec(after_revision) + " (" + Describe() +
                           ")");
    }
    return r.status();
  }
  // The stream ended without an event: etcd went away or closed it.
  if (!sink.buf.empty()) {
    auto msg = ParseEtcdReply(sink.buf);
    if (!msg.ok()) return msg.status();
  }
  return UnavailableError("etcd ended the watch of '" + std::string(key) + "' without an event (" +
                          Describe() + "); was it stopped?");
}

}  // namespace rdmaps::internal
