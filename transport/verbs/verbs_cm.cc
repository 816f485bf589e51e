// The verbs backend's connection handling over rdma_cm: Listen, Connect,
// the handshake of verbs_wire.h, and on the progress thread the connect
// requests, establishments and disconnects of the endpoint's event channel;
// plus the QP state moves with the attributes rdma_cm computes.
//
// Connect runs on the caller's thread with a private event channel: address
// and route resolution, REQ, CONNECT_RESPONSE, our QP to RTR/RTS, then
// rdma_establish (the RTU); the id then migrates to the endpoint's channel,
// where the progress thread sees its disconnect. An accepted id is born on
// the endpoint's channel: the progress thread checks the REQ, creates the
// connection, moves its QP to RTS and answers with rdma_accept; the
// connection goes to the accept queue at ESTABLISHED.
#include <arpa/inet.h>
#include <endian.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/base/host_port.h"
#include "src/base/log.h"
#include "transport/verbs/verbs_internal.h"

namespace rdmaps::transport::verbs::internal {
namespace {

constexpr int kListenBacklog = 128;

std::string SockaddrToString(const sockaddr* sa) {
  return sa == nullptr ? "?" : rdmaps::SockaddrToString(sa);
}

int ClampMs(Deadline deadline, int cap_ms) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 1, cap_ms));
}

}  // namespace

bool GetCmEvent(rdma_event_channel* ch, CmEvent* out) {
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return false;
  out->type = ev->event;
  out->id = ev->id;
  out->listen_id = ev->listen_id;
  out->status = ev->status;
  const auto& c = ev->param.conn;
  out->private_data.assign(
      static_cast<const std::uint8_t*>(c.private_data),
      static_cast<const std::uint8_t*>(c.private_data) + (c.private_data ? c.private_data_len : 0));
  out->initiator_depth = c.initiator_depth;
  out->responder_resources = c.responder_resources;
  rdma_ack_cm_event(ev);
  return true;
}

Result<CmEvent> WaitCmEvent(rdma_event_channel* ch, Deadline deadline, std::string_view step) {
  while (true) {
    CmEvent ev;
    if (GetCmEvent(ch, &ev)) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoError("rdma_get_cm_event while " + std::string(step), errno);
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) {
      return TimedOutError(std::string(step) + " did not finish by the deadline");
    }
    pollfd pfd{ch->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
  }
}

// --- VerbsConnection: QP state moves ---------------------------------------

Status VerbsConnection::MoveQp(ibv_qp_state state, const std::string& where,
                               const std::function<Status(ibv_qp_attr&, int&)>& adjust) {
  const char* name = state == IBV_QPS_INIT  ? "INIT"
                     : state == IBV_QPS_RTR ? "RTR"
                     : state == IBV_QPS_RTS ? "RTS"
                                            : "?";
  ibv_qp_attr qa{};
  int mask = 0;
  qa.qp_state = state;
  if (rdma_init_qp_attr(id_.get(), &qa, &mask) != 0) {
    return ErrnoError(std::string("rdma_init_qp_attr(") + name + ") " + where, errno);
  }
  if (adjust) RDMAPS_RETURN_IF_ERROR(adjust(qa, mask));
  if (int rc = ibv_modify_qp(qp_.get(), &qa, mask); rc != 0) {
    return ErrnoError(std::string("ibv_modify_qp(") + name + ") " + where, rc);
  }
  return Status::OK();
}

Status VerbsConnection::ConnectQp(int responder_resources, int initiator_depth,
                                  bool hold_remote_access) {
  const std::string where = "for " + peer_.address;
  // Held access: rdma_cm's flags are kept for GrantRemoteAccess and the QP
  // gets none (a peer's READ/WRITE/atomic is refused by the NIC; SENDs, the
  // handshake's proof, need no access right).
  auto hold = [&](ibv_qp_attr& qa, int& mask) {
    if (hold_remote_access && (mask & IBV_QP_ACCESS_FLAGS)) {
      granted_access_ |= static_cast<int>(qa.qp_access_flags);
      qa.qp_access_flags = 0;
    }
  };
  // INIT again first, as librdmacm does: on the connector the QP reached INIT
  // before the CM exchange, when rdma_cm knew no access flags yet (remote
  // READ/atomic rights come from the negotiated responder resources).
  RDMAPS_RETURN_IF_ERROR(MoveQp(IBV_QPS_INIT, where, [&](ibv_qp_attr& qa, int& mask) {
    hold(qa, mask);
    return Status::OK();
  }));
  RDMAPS_RETURN_IF_ERROR(MoveQp(IBV_QPS_RTR, where, [&](ibv_qp_attr& qa, int& mask) {
    hold(qa, mask);
    return AdjustRtr(qa, mask, responder_resources);
  }));
  return MoveQp(IBV_QPS_RTS, where, [&](ibv_qp_attr& qa, int& mask) {
    hold(qa, mask);
    if (initiator_depth >= 0) qa.max_rd_atomic = static_cast<std::uint8_t>(initiator_depth);
    return Status::OK();
  });
}

Status VerbsConnection::GrantRemoteAccess() {
  ibv_qp_attr qa{};
  qa.qp_state = IBV_QPS_RTS;
  qa.qp_access_flags = static_cast<unsigned>(granted_access_);
  if (int rc = ibv_modify_qp(qp_.get(), &qa, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS); rc != 0) {
    return ErrnoError("ibv_modify_qp(RTS, access flags) for " + peer_.address, rc);
  }
  return Status::OK();
}

Status VerbsConnection::AdjustRtr(ibv_qp_attr& qa, int& mask, int responder_resources) const {
  if (shared_->port_attr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    // librdmacm's workaround for an old rdma_ucm bug: bits 21-24 are RoCE only.
    mask &= ~0xe00000;
  }
  if (responder_resources >= 0) {
    qa.max_dest_rd_atomic = static_cast<std::uint8_t>(responder_resources);
  }
  const int forced = shared_->options.gid_index;
  if (forced >= 0 && (mask & IBV_QP_AV) && qa.ah_attr.is_global &&
      qa.ah_attr.grh.sgid_index != forced) {
    // rdma_cm chose the GID of the address this connection uses. The forced
    // one must hold the same GID (on RoCE: the same IP; Connect resolves from
    // it, Listen checks it) - it may differ in type, e.g. RoCE v1 vs v2 -
    // else the peer, which addresses the GID it saw in the CM exchange,
    // would drop our packets.
    ibv_gid chosen{};
    if (ibv_query_gid(shared_->ctx, static_cast<std::uint8_t>(shared_->port),
                      qa.ah_attr.grh.sgid_index, &chosen) == 0 &&
        std::memcmp(chosen.raw, shared_->forced_gid.raw, 16) != 0) {
      return FailedPreconditionError(
          "gid_index " + std::to_string(forced) + " on " + shared_->dev_name + " is GID " +
          GidToString(shared_->forced_gid) + ", but the connection with " + peer_.address +
          " runs over GID " + GidToString(chosen) + " (index " +
          std::to_string(qa.ah_attr.grh.sgid_index) +
          "); listen on / connect from the forced GID's address, or set gid_index=-1");
    }
    qa.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(forced);
  }
  return Status::OK();
}

// --- VerbsEndpoint: Listen, Connect --------------------------------------

Result<std::string> VerbsEndpoint::DoListen(std::string_view address, const HostPort& hp) {
  if (listen_id_) return FailedPreconditionError("Listen called twice on one endpoint");
  RDMAPS_ASSIGN_OR_RETURN(AddrInfoList ai, ResolveHostPort(hp, AddressUse::kListen));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(shared_->channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return ErrnoError("rdma_create_id for listening", errno);
  }
  CmIdPtr id(raw);
  if (rdma_bind_addr(id.get(), ai->ai_addr) != 0) {
    int e = errno;
    return UnavailableError("rdma_bind_addr(" + std::string(address) +
                            ") failed: " + std::strerror(e) +
                            (e == EADDRINUSE ? "; the port is taken, use port 0"
                                             : "; the address must be an IP of an "
                                               "RDMA device's netdev (`rdma link`)"));
  }
  if (id->verbs != nullptr && id->verbs != shared_->ctx) {
    return FailedPreconditionError(
        "listen address " + std::string(address) + " belongs to RDMA device " +
        ibv_get_device_name(id->verbs->device) + ", but this endpoint uses " + shared_->dev_name +
        "; create the endpoint with EndpointOptions::address_hint = "
        "the listen address, or ib_dev (--ib-dev) = " +
        ibv_get_device_name(id->verbs->device));
  }
  if (options().gid_index >= 0 && shared_->forced_src.ss_family != 0 && !IsWildcard(ai->ai_addr)) {
    ibv_gid listen_gid{};
    SockaddrToGid(ai->ai_addr, &listen_gid);
    if (std::memcmp(listen_gid.raw, shared_->forced_gid.raw, 16) != 0) {
      return FailedPreconditionError(
          "listen address " + std::string(address) + " is GID " + GidToString(listen_gid) +
          ", but gid_index " + std::to_string(options().gid_index) + " on " + shared_->dev_name +
          " is " + GidToString(shared_->forced_gid) +
          ": peers would reach us on one GID and our queue pairs answer from another; "
          "listen on the forced GID's address or set gid_index=-1");
    }
  }
  if (id->verbs == nullptr && hp.host != "0.0.0.0" && hp.host != "::") {
    return FailedPreconditionError("listen address " + std::string(address) +
                                   " is not on an RDMA device; use the IP of the "
                                   "device's netdev (see `rdma link`)");
  }
  { MutexLock publish(shared_->mu); }  // see ProgressLoop
  if (rdma_listen(id.get(), kListenBacklog) != 0) {
    return ErrnoError("rdma_listen on " + std::string(address), errno);
  }
  std::uint16_t bound = ntohs(rdma_get_src_port(id.get()));
  listen_id_ = std::move(id);
  return JoinHostPort(hp.host, bound);
}

Result<std::unique_ptr<Connection>> VerbsEndpoint::DoConnect(std::string_view address,
                                                             const HostPort& hp,
                                                             const ConnectOptions& copts,
                                                             Deadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(AddrInfoList ai, ResolveHostPort(hp, AddressUse::kConnect));
  const std::string where(address);

  // A private channel: this thread waits for its own id's events; the id
  // moves to the endpoint's channel once established.
  EventChannelPtr ch(rdma_create_event_channel());
  if (!ch) return ErrnoError("rdma_create_event_channel", errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(ch->fd, "rdma_cm event channel"));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(ch.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return ErrnoError("rdma_create_id", errno);
  }
  CmIdPtr id(raw);

  // A forced GID is a source address: resolving from it makes rdma_cm's path
  // (and so the GID the peer sees in the CM exchange) match the QP's.
  sockaddr* src = nullptr;
  if (options().gid_index >= 0 && shared_->forced_src.ss_family != 0) {
    if (shared_->forced_src.ss_family != ai->ai_addr->sa_family) {
      return FailedPreconditionError(
          "gid_index " + std::to_string(options().gid_index) + " on " + shared_->dev_name +
          " is GID " + GidToString(shared_->forced_gid) + ", an " +
          FamilyName(shared_->forced_src.ss_family) + " address, but " + where + " is " +
          FamilyName(ai->ai_addr->sa_family) +
          ": a RoCE connection uses one IP family end to end; pick a GID of the peer's "
          "family (`ibv_devinfo -v`, `rdmaps-doctor`) or set gid_index=-1");
    }
    src = reinterpret_cast<sockaddr*>(&shared_->forced_src);
  }
  if (rdma_resolve_addr(id.get(), src, ai->ai_addr, ClampMs(deadline, 5000)) != 0) {
    int e = errno;
    return UnavailableError(
        "rdma_resolve_addr(" + where + ") failed: " + std::strerror(e) +
        (src != nullptr
             ? "; the source is gid_index " + std::to_string(options().gid_index) + "'s address " +
                   GidToString(shared_->forced_gid) + ", which must be able to reach the peer"
             : std::string()));
  }
  RDMAPS_ASSIGN_OR_RETURN(CmEvent ev, WaitCmEvent(ch.get(), deadline, "resolving " + where));
  if (ev.type != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return UnavailableError(
        "cannot reach " + where + " over RDMA: " + rdma_event_str(ev.type) + " (status " +
        std::to_string(ev.status) +
        ") - no RDMA device has a route to that IP; check the address is on an "
        "RDMA-capable interface of the peer and routable from ours (`rdma link`, "
        "`ip route`), run `rdmaps-doctor --peer " +
        where + "`, or use --transport=tcp");
  }
  if (id->verbs != shared_->ctx) {
    const std::string other = id->verbs ? ibv_get_device_name(id->verbs->device) : "?";
    return FailedPreconditionError(where + " is reached through RDMA device " + other +
                                   ", but this endpoint uses " + shared_->dev_name +
                                   "; create the endpoint with EndpointOptions::address_hint = "
                                   "the peer's address, or ib_dev (--ib-dev) = " +
                                   other);
  }
  if (rdma_resolve_route(id.get(), ClampMs(deadline, 5000)) != 0) {
    return ErrnoError("rdma_resolve_route(" + where + ")", errno);
  }
  RDMAPS_ASSIGN_OR_RETURN(ev, WaitCmEvent(ch.get(), deadline, "resolving the route to " + where));
  if (ev.type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return UnavailableError("no RDMA route to " + where + ": " + rdma_event_str(ev.type) +
                            " (status " + std::to_string(ev.status) +
                            "); check GIDs and routing (`rdmaps-doctor --peer " + where + "`)");
  }

  PeerInfo peer;
  peer.address = where;
  auto conn = std::make_unique<VerbsConnection>(shared_, std::move(peer));
  rdma_cm_id* idp = id.get();
  RDMAPS_RETURN_IF_ERROR(conn->Init(std::move(id)));

  ConnectWire req{};
  req.magic = htobe32(kConnectMagic);
  req.version = htobe16(version_.load());
  req.user_len = static_cast<std::uint8_t>(copts.user_data.size());
  req.peer_id = htobe32(options().peer_id);
  std::array<std::uint8_t, 8> nonce;
  RandomBytes(nonce);
  std::copy(nonce.begin(), nonce.end(), req.nonce);
  std::copy(copts.user_data.begin(), copts.user_data.end(), req.user_data);
  const SecretKey key = SecretKey::FromSecret(options().job_token);
  const auto req_mac = ConnectMac(key, version_.load(), nonce, options().peer_id, copts.user_data);
  std::copy(req_mac.begin(), req_mac.end(), req.mac);
  rdma_conn_param param{};
  param.private_data = &req;
  param.private_data_len = sizeof req;
  param.initiator_depth =
      static_cast<std::uint8_t>(std::min(shared_->dev_attr.max_qp_init_rd_atom, 255));
  param.responder_resources =
      static_cast<std::uint8_t>(std::min(shared_->dev_attr.max_qp_rd_atom, 255));
  param.retry_count = 7;
  param.rnr_retry_count = 7;      // infinite: notification receives are reposted
  param.qp_num = conn->qp_num();  // our QP, not one on the id
  param.srq = 1;
  if (rdma_connect(idp, &param) != 0) {
    return ErrnoError("rdma_connect(" + where + ")", errno);
  }
  RDMAPS_ASSIGN_OR_RETURN(ev, WaitCmEvent(ch.get(), deadline, "connecting to " + where));
  if (ev.type == RDMA_CM_EVENT_REJECTED) {
    RejectWire rej{};
    if (ev.private_data.size() >= sizeof rej) {
      std::memcpy(&rej, ev.private_data.data(), sizeof rej);
    }
    if (be32toh(rej.magic) == kRejectMagic) {
      switch (rej.reason) {
        case kRejectBadToken:
          return PermissionDeniedError("peer " + where +
                                       " rejected the connection: job secret mismatch (our MAC "
                                       "did not verify there); " +
                                       std::string(kJobSecretFix));
        case kRejectReplay:
          return PermissionDeniedError("peer " + where +
                                       " rejected the connection as a replayed request; connect "
                                       "again");
        case kRejectBadVersion:
          return FailedPreconditionError(
              "peer " + where + " rejected the connection: it speaks protocol version " +
              std::to_string(be16toh(rej.version)) + ", we speak " +
              std::to_string(version_.load()) + "; run the same rdmaps version everywhere");
        case kRejectNoResources:
          return ResourceExhaustedError("peer " + where +
                                        " could not create a queue pair for us; see its log");
        default:
          return InvalidArgumentError("peer " + where + " rejected our handshake as malformed");
      }
    }
    return UnavailableError("nobody listens on " + where + " (RDMA_CM_EVENT_REJECTED, status " +
                            std::to_string(ev.status) +
                            "); start the server first or check the port");
  }
  if (ev.type != RDMA_CM_EVENT_CONNECT_RESPONSE) {
    return UnavailableError("connecting to " + where + " failed: " + rdma_event_str(ev.type) +
                            " (status " + std::to_string(ev.status) +
                            "); check that the peer is up and reachable (`rdmaps-doctor "
                            "--peer " +
                            where + "`)");
  }
  Result<AcceptReply> rep =
      ev.private_data.size() >= sizeof(AcceptWire)
          ? ParseAcceptWire(std::as_bytes(std::span(ev.private_data)).first(sizeof(AcceptWire)))
          : Result<AcceptReply>(InvalidArgumentError("no reply"));
  if (!rep.ok()) {
    return FailedPreconditionError("peer " + where +
                                   " accepted without an rdmaps handshake; "
                                   "is it an rdmaps endpoint?");
  }
  if (!ConstantTimeEqual(AcceptMac(key, version_.load(), nonce, rep->nonce, options().peer_id,
                                   rep->peer_id, copts.user_data),
                         rep->mac)) {
    // No RTU: the acceptor's half-open connection times out there.
    return PermissionDeniedError("job secret mismatch: peer " + std::to_string(rep->peer_id) +
                                 " at " + where +
                                 " did not prove knowledge of this job's secret (MAC mismatch; "
                                 "this process is peer " +
                                 std::to_string(options().peer_id) + "); " + kJobSecretFix);
  }
  // Who the peer is (its MAC verified it) and PeerInfo::connection, before
  // our QP can receive: the acceptor may WRITE_WITH_IMM as soon as it has
  // confirmed our proof, before this thread returns, and the progress
  // thread files that notification under the peer id it reads from the
  // connection then (a replacement backup's primary answers at once: with
  // peer id 0 the answer was dropped as no connection's).
  conn->set_peer_id(rep->peer_id);
  // PeerInfo::connection is non-zero on both sides (transport.h): a consumer
  // that takes immediates on a connection it opened (a replacement backup's
  // log from its primary) matches them to it.
  conn->set_connection_from_qp();
  // The REP arrived: our QP to RTR/RTS, then the RTU (rdma_establish).
  RDMAPS_RETURN_IF_ERROR(conn->ConnectQp(-1, -1));
  const std::uint32_t qpn = conn->qp_num();
  {
    MutexLock lock(shared_->mu);
    shared_->handshake_rx[qpn].clear();  // before the acceptor can answer
  }
  struct Unlist {
    Shared* s;
    std::uint32_t qpn;
    ~Unlist() {
      MutexLock lock(s->mu);
      s->handshake_rx.erase(qpn);
    }
  } unlist{shared_.get(), qpn};
  if (rdma_establish(idp) != 0) return ErrnoError("rdma_establish(" + where + ")", errno);
  // The proof over the acceptor's nonce (verbs_wire.h), then its answer.
  const ProofWords proof = ConnectorProof(key, version_.load(), nonce, rep->nonce,
                                          options().peer_id, rep->peer_id, copts.user_data);
  RDMAPS_RETURN_IF_ERROR(conn->PostHandshakeSends(proof));
  RDMAPS_RETURN_IF_ERROR(AwaitProofAccepted(ch.get(), qpn, where, deadline));
  RunAfterProofHook();
  conn->Register();  // before the migrate: publishes the id under mu (see ProgressLoop)
  if (rdma_migrate_id(idp, shared_->channel.get()) != 0) {
    return ErrnoError("rdma_migrate_id", errno);
  }
  return std::unique_ptr<Connection>(std::move(conn));
}

Status VerbsEndpoint::AwaitProofAccepted(rdma_event_channel* ch, std::uint32_t qpn,
                                         const std::string& where, Deadline deadline) {
  // The answer arrives on the SRQ (the progress thread files it); a refusal
  // is a disconnect on our private channel, looked at between waits.
  constexpr auto kSlice = std::chrono::milliseconds(20);
  while (true) {
    {
      MutexLock lock(shared_->mu);
      const auto until = std::min<Deadline>(deadline, SteadyClock::now() + kSlice);
      if (shared_->handshake_rx[qpn].empty()) {
        shared_->handshake_cv.wait_until(lock.native(), until);
      }
      const std::vector<std::uint32_t>& got = shared_->handshake_rx[qpn];
      if (!got.empty()) {
        if (got.front() == kProofAccepted) return Status::OK();
        return InvalidArgumentError("peer " + where +
                                    " answered our proof of the job secret with an unknown "
                                    "message; is it the same rdmaps version?");
      }
    }
    CmEvent ev;
    if (GetCmEvent(ch, &ev) &&
        (ev.type == RDMA_CM_EVENT_DISCONNECTED || ev.type == RDMA_CM_EVENT_CONNECT_ERROR)) {
      return PermissionDeniedError(
          "peer " + where +
          " closed the connection instead of accepting our proof of the job secret over its "
          "nonce (its log says why); " +
          std::string(kJobSecretFix));
    }
    if (SteadyClock::now() >= deadline) {
      return TimedOutError("peer " + where +
                           " did not confirm our proof of the job secret by the connect "
                           "deadline; is it stuck, or an older rdmaps version?");
    }
  }
}

// --- VerbsEndpoint: the progress thread's rdma_cm events ------------------

void VerbsEndpoint::Reject(rdma_cm_id* id, RejectReason reason) {
  RejectWire rej{};
  rej.magic = htobe32(kRejectMagic);
  rej.version = htobe16(version_.load());
  rej.reason = reason;
  rdma_reject(id, &rej, sizeof rej);
}

void VerbsEndpoint::HandleConnectRequest(CmEvent& ev) {
  CmIdPtr id(ev.id);  // ours now: destroyed unless the connection takes it
  if (ev.private_data.size() < sizeof(ConnectWire)) {
    Reject(id.get(), kRejectMalformed);
    return;
  }
  Result<ConnectRequest> parsed =
      ParseConnectWire(std::as_bytes(std::span(ev.private_data)).first(sizeof(ConnectWire)));
  if (!parsed.ok()) {
    Reject(id.get(), kRejectMalformed);
    return;
  }
  ConnectRequest& req = *parsed;
  if (req.version != version_.load()) {
    RDMAPS_LOG_EVERY_T(WARNING, 0.2)
        << "verbs: rejected a peer with protocol version " << req.version;
    Reject(id.get(), kRejectBadVersion);
    return;
  }
  const SecretKey key = SecretKey::FromSecret(options().job_token);
  if (!ConstantTimeEqual(ConnectMac(key, req.version, req.nonce, req.peer_id, req.user_data),
                         req.mac)) {
    RDMAPS_LOG_EVERY_T(WARNING, 0.2)
        << "verbs: rejected peer " << req.peer_id << " from "
        << SockaddrToString(rdma_get_peer_addr(id.get()))
        << ": job secret mismatch (its MAC does not verify); " << kJobSecretFix;
    Reject(id.get(), kRejectBadToken);
    return;
  }
  // A REQ seen before is a replay (the nonce is random per connect).
  std::uint64_t nonce_key;
  std::memcpy(&nonce_key, req.nonce.data(), sizeof(nonce_key));
  if (!seen_nonces_.insert(nonce_key).second) {
    RDMAPS_LOG_EVERY_T(WARNING, 0.2)
        << "verbs: rejected a replayed connect request claiming peer " << req.peer_id << " from "
        << SockaddrToString(rdma_get_peer_addr(id.get()));
    Reject(id.get(), kRejectReplay);
    return;
  }
  seen_order_.push_back(nonce_key);
  if (seen_order_.size() > kMaxSeenNonces) {
    seen_nonces_.erase(seen_order_.front());
    seen_order_.pop_front();
  }
  if (id->verbs != shared_->ctx) {
    RDMAPS_LOG(WARNING) << "verbs: connect request arrived on another device than "
                        << shared_->dev_name;
    Reject(id.get(), kRejectNoResources);
    return;
  }
  PeerInfo peer;
  peer.peer_id = req.peer_id;
  peer.address = SockaddrToString(rdma_get_peer_addr(id.get()));
  peer.user_data = req.user_data;
  auto conn = std::make_unique<VerbsConnection>(shared_, std::move(peer));
  rdma_cm_id* idp = id.get();
  if (Status s = conn->Init(std::move(id)); !s.ok()) {
    RDMAPS_LOG(WARNING) << "verbs: cannot accept peer " << req.peer_id << ": " << s;
    Reject(idp, kRejectNoResources);
    return;  // conn's destructor destroys the id
  }
  conn->set_connection_from_qp();
  AcceptWire rep{};
  rep.magic = htobe32(kAcceptMagic);
  rep.version = htobe16(version_.load());
  rep.peer_id = htobe32(options().peer_id);
  const Nonce acceptor_nonce = RandomNonce();
  std::copy(acceptor_nonce.begin(), acceptor_nonce.end(), rep.nonce);
  const Mac rep_mac = AcceptMac(key, req.version, req.nonce, acceptor_nonce, req.peer_id,
                                options().peer_id, req.user_data);
  std::copy(rep_mac.begin(), rep_mac.end(), rep.mac);
  rdma_conn_param param{};
  param.private_data = &rep;
  param.private_data_len = sizeof rep;
  param.responder_resources = static_cast<std::uint8_t>(
      std::min<int>({shared_->dev_attr.max_qp_rd_atom, ev.initiator_depth, 255}));
  param.initiator_depth = static_cast<std::uint8_t>(
      std::min<int>({shared_->dev_attr.max_qp_init_rd_atom, ev.responder_resources, 255}));
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  param.qp_num = conn->qp_num();
  param.srq = 1;
  // Our QP goes to RTR and RTS before the REP, as rdma_accept would do
  // with a QP of its own.
  if (Status s = conn->ConnectQp(param.responder_resources, param.initiator_depth,
                                 /*hold_remote_access=*/true);
      !s.ok()) {
    RDMAPS_LOG(WARNING) << "verbs: cannot accept peer " << req.peer_id << ": " << s;
    Reject(idp, kRejectNoResources);
    return;
  }
  PendingAccept pending;
  pending.proof = ConnectorProof(key, req.version, req.nonce, acceptor_nonce, req.peer_id,
                                 options().peer_id, req.user_data);
  {
    MutexLock lock(shared_->mu);
    shared_->handshake_rx[conn->qp_num()].clear();  // the proof may precede ESTABLISHED
  }
  if (rdma_accept(idp, &param) != 0) {
    RDMAPS_LOG(WARNING) << "verbs: rdma_accept failed: " << std::strerror(errno);
    MutexLock lock(shared_->mu);
    shared_->handshake_rx.erase(conn->qp_num());
    return;
  }
  pending.conn = std::move(conn);
  pending_accept_[idp] = std::move(pending);
}

void VerbsEndpoint::CheckProofs() {
  const auto now = SteadyClock::now();
  for (auto it = awaiting_proof_.begin(); it != awaiting_proof_.end();) {
    PendingAccept& p = it->second;
    const std::uint32_t qpn = p.conn->qp_num();
    std::string refused;
    {
      MutexLock lock(shared_->mu);
      const std::vector<std::uint32_t>& got = shared_->handshake_rx[qpn];
      if (got.size() >= kProofWords) {
        ProofWords words;
        std::copy_n(got.begin(), kProofWords, words.begin());
        if (!ProofEqual(words, p.proof)) {
          refused =
              "its proof of the job secret over our nonce does not verify (a connect "
              "request replayed from a capture?)";
        }
      } else if (now >= p.deadline) {
        refused = "it sent no proof of the job secret over our nonce within " +
                  std::to_string(ProofTimeout().count()) +
                  " ms (a connect request replayed from a capture, or an older rdmaps?)";
      } else {
        ++it;
        continue;
      }
      shared_->handshake_rx.erase(qpn);
    }
    std::unique_ptr<VerbsConnection> conn = std::move(p.conn);
    it = awaiting_proof_.erase(it);
    const std::string who =
        "peer " + std::to_string(conn->peer().peer_id) + " from " + conn->peer().address;
    Status s = refused.empty() ? conn->GrantRemoteAccess() : Status::OK();
    if (s.ok() && refused.empty()) {
      const std::uint32_t ok = kProofAccepted;
      s = conn->PostHandshakeSends(std::span(&ok, 1));
    }
    if (!refused.empty() || !s.ok()) {
      RDMAPS_LOG_EVERY_T(WARNING, 0.2)
          << "verbs: refused " << who << ": " << (refused.empty() ? s.ToString() : refused);
      rdma_disconnect(conn->id());
      continue;  // conn's destructor destroys the QP and the id
    }
    conn->Register();
    MutexLock lock(shared_->mu);
    shared_->accepted.push_back(std::move(conn));
    shared_->accept_cv.notify_all();
  }
}

void VerbsEndpoint::HandleCmEvent(CmEvent& ev) {
  switch (ev.type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      HandleConnectRequest(ev);
      return;
    case RDMA_CM_EVENT_ESTABLISHED: {
      // Handed up only once the connector's proof verifies (CheckProofs).
      auto it = pending_accept_.find(ev.id);
      if (it == pending_accept_.end()) return;
      PendingAccept p = std::move(it->second);
      pending_accept_.erase(it);
      p.deadline = SteadyClock::now() + ProofTimeout();
      awaiting_proof_[ev.id] = std::move(p);
      CheckProofs();
      return;
    }
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_DISCONNECTED: {
      for (auto* m : {&pending_accept_, &awaiting_proof_}) {
        auto it = m->find(ev.id);
        if (it == m->end()) continue;
        {
          MutexLock lock(shared_->mu);
          shared_->handshake_rx.erase(it->second.conn->qp_num());
        }
        m->erase(it);  // never handed up
        return;
      }
      DrainRecvCq();  // the peer's immediates precede its kDisconnected
      MutexLock lock(shared_->mu);
      auto it = shared_->by_id.find(ev.id);
      if (it == shared_->by_id.end()) return;  // already destroyed by its owner
      VerbsConnection* conn = it->second;
      std::string why = ev.type == RDMA_CM_EVENT_DISCONNECTED
                            ? "peer " + conn->peer().address + " disconnected"
                            : std::string("connection to ") + conn->peer().address +
                                  " failed: " + rdma_event_str(ev.type);
      if (conn->OnConnectionLost_locked(UnavailableError(why + "; reconnect when it is back"))) {
        Notification n;
        n.kind = Notification::Kind::kDisconnected;
        n.peer_id = conn->peer().peer_id;
        n.connection = conn->qp_num();
        shared_->notifications.push_back(n);
        shared_->notes_cv.notify_all();
      }
      return;
    }
    case RDMA_CM_EVENT_DEVICE_REMOVAL: {
      RDMAPS_LOG(ERROR) << "verbs: RDMA device " << shared_->dev_name << " was removed";
      MutexLock lock(shared_->mu);
      for (auto& [qp, conn] : shared_->by_qp) {
        conn->OnConnectionLost_locked(UnavailableError("RDMA device " + shared_->dev_name +
                                                       " was removed; restart on another device"));
      }
      return;
    }
    default:
      return;  // TIMEWAIT_EXIT, ADDR_CHANGE, ...
  }
}

}  // namespace rdmaps::transport::verbs::internal
