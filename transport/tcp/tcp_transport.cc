// Setup code of the tcp backend: endpoints, registration, listening,
// connecting and the handshake, and the progress thread's event loop. The
// per-op paths live in tcp_datapath.cc; the wire protocol in tcp_wire.h.
// Over 700 lines because the event loop and the handshake it drives (hello,
// session pairing of the two sockets, accept) are one state machine per
// inbound socket; the Endpoint class on top is short.
#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "src/base/log.h"
#include "transport/tcp/tcp_frames.h"
#include "transport/tcp/tcp_internal.h"

namespace rdmaps::transport::tcp {
namespace {

std::uint64_t RandomU64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

// epoll tags for the two non-Inbound fds.
char kWakeTag;
char kListenerTag;

StatusCode CodeFromWire(std::uint8_t code) {
  if (code > static_cast<std::uint8_t>(StatusCode::kInternal)) return StatusCode::kInternal;
  return static_cast<StatusCode>(code);
}

}  // namespace

// ---------------------------------------------------------------------------
// RegionTable

RegionTable::RegionTable() : next_rkey_(static_cast<std::uint32_t>(RandomU64()) | 1) {}

std::uint32_t RegionTable::Add(std::byte* base, std::size_t size, std::uint32_t access) {
  WriterLock lock(mu_);
  std::uint32_t key;
  do {
    key = next_rkey_++;
  } while (key == 0 || regions_.count(key) != 0);
  regions_[key] = RegionEntry{base, size, access};
  return key;
}

void RegionTable::Remove(std::uint32_t rkey) {
  WriterLock lock(mu_);
  regions_.erase(rkey);
}

const RegionEntry* RegionTable::FindLocked(std::uint32_t rkey) const {
  auto it = regions_.find(rkey);
  return it == regions_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------
// Inbound

Inbound::Inbound() : rx(new std::byte[kRxBufferBytes]) {}

void Inbound::Shutdown() {
  MutexLock lock(close_mu);
  if (!closed && fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
}

// ---------------------------------------------------------------------------
// EndpointCore: setup and event loop

EndpointCore::EndpointCore(EndpointOptions options)
    : options_(std::move(options)),
      regions_(std::make_shared<RegionTable>()),
      handshake_timeout_(
          std::min<std::chrono::milliseconds>(options_.op_timeout, std::chrono::seconds(10))),
      key_(SecretKey::FromSecret(options_.job_token)),
      session_seed_(RandomU64()) {
  reserve_fd_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

EndpointCore::~EndpointCore() { Stop(); }

Status EndpointCore::Start() {
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return ErrnoError("epoll_create1", errno);
  wake_fd_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) return ErrnoError("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &kWakeTag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    return ErrnoError("epoll_ctl(eventfd)", errno);
  }
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

void EndpointCore::Stop() {
  {
    MutexLock lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (thread_.joinable()) {
    Wake();
    thread_.join();
  }
  accept_cv_.notify_all();
  notes_cv_.notify_all();
  std::deque<std::unique_ptr<Connection>> accepted;
  {
    MutexLock lock(mu_);
    accepted.swap(accepted_);
    new_served_.clear();
    new_listeners_.clear();
  }
  accepted.clear();  // Their Close() touches Inbounds, which we still hold.
  for (auto& [ptr, in] : inbound_) {
    MutexLock lock(in->close_mu);
    in->closed = true;
    in->fd.Reset();
  }
  inbound_.clear();
  sessions_.clear();
  graveyard_.clear();
  listeners_.clear();
}

void EndpointCore::Wake() {
  std::uint64_t one = 1;
  ssize_t r = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)r;  // EAGAIN means a wake is already pending.
}

void EndpointCore::AdoptListener(Fd fd) {
  {
    MutexLock lock(mu_);
    listening_ = true;
    new_listeners_.push_back(std::move(fd));
  }
  Wake();
}

void EndpointCore::AdoptServed(std::shared_ptr<Inbound> in) {
  {
    MutexLock lock(mu_);
    new_served_.push_back(std::move(in));
  }
  Wake();
}

void EndpointCore::PushNotification(const Notification& n) { round_notes_.push_back(n); }

void EndpointCore::DeliverNotifications() {
  if (round_notes_.empty()) return;
  {
    MutexLock lock(mu_);
    notifications_.insert(notifications_.end(), round_notes_.begin(), round_notes_.end());
    queued_notes_.store(notifications_.size());
  }
  round_notes_.clear();
  notes_cv_.notify_all();
}

Result<std::size_t> EndpointCore::WaitNotifications(std::span<Notification> out,
                                                    Deadline deadline) {
  if (out.empty()) return InvalidArgumentError("WaitNotifications with an empty output span");
  MutexLock lock(mu_);
  while (notifications_.empty() && !interrupted_ && !stop_) {
    if (notes_cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  std::size_t n = 0;
  while (n < out.size() && !notifications_.empty()) {
    out[n++] = notifications_.front();
    notifications_.pop_front();
  }
  queued_notes_.store(notifications_.size());
  if (n == 0 && interrupted_) interrupted_ = false;
  // Half empty again: let the progress thread serve the paused peers.
  if (n > 0 && notifications_.size() <= options_.max_queued_notifications / 2 &&
      any_paused_.load()) {
    lock.Unlock();
    Wake();
  }
  return n;
}

void EndpointCore::ResumePaused() {
  if (!any_paused_.exchange(false)) return;
  std::vector<Inbound*> paused;
  paused.swap(paused_);
  for (Inbound* p : paused) {
    auto it = inbound_.find(p);
    if (it == inbound_.end()) continue;  // closed meanwhile
    std::shared_ptr<Inbound> in = it->second;
    in->paused_listed = false;
    if (!in->paused) continue;  // went on by itself
    in->paused = false;
    in->last_progress = SteadyClock::now();
    Status s = Serve(*in);  // may pause it again
    if (!s.ok()) {
      CloseInbound(in, s.message(), s.code() != StatusCode::kCancelled);
      continue;
    }
    UpdateEpoll(*in);
  }
}

Result<std::unique_ptr<Connection>> EndpointCore::Accept(Deadline deadline) {
  MutexLock lock(mu_);
  if (!listening_) return FailedPreconditionError("Accept before Listen; call Listen first");
  while (accepted_.empty() && !interrupted_ && !stop_) {
    if (accept_cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  if (!accepted_.empty()) {
    auto conn = std::move(accepted_.front());
    accepted_.pop_front();
    return conn;
  }
  if (interrupted_) {
    interrupted_ = false;
    return CancelledError("Accept was interrupted by Endpoint::Interrupt()");
  }
  if (stop_) return CancelledError("Accept: the endpoint is shutting down");
  return TimedOutError(
      "Accept: no peer connected by the deadline; check that peers connect to "
      "the address Listen returned, with the same job token");
}

void EndpointCore::Interrupt() {
  {
    MutexLock lock(mu_);
    interrupted_ = true;
  }
  accept_cv_.notify_all();
  notes_cv_.notify_all();
}

void EndpointCore::Run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  const int tick_ms =
      static_cast<int>(std::clamp<std::int64_t>(handshake_timeout_.count() / 4, 1, 100));
  for (;;) {
    int timeout = inbound_.empty() && !listeners_paused_ ? -1 : tick_ms;
    int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, timeout);
    if (n < 0 && errno != EINTR) {
      RDMAPS_PLOG(ERROR) << "tcp transport: epoll_wait failed; inbound ops are no longer served";
      return;
    }
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &kWakeTag) {
        std::uint64_t v;
        ssize_t r = ::read(wake_fd_.get(), &v, sizeof(v));
        (void)r;
        std::vector<Fd> listeners;
        std::vector<std::shared_ptr<Inbound>> served;
        {
          MutexLock lock(mu_);
          if (stop_) return;
          listeners.swap(new_listeners_);
          served.swap(new_served_);
        }
        for (Fd& l : listeners) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = &kListenerTag;
          if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, l.get(), &ev) != 0) {
            RDMAPS_PLOG(WARNING) << "tcp transport: cannot watch the listening socket";
          }
          listeners_.push_back(std::move(l));
        }
        for (auto& in : served) {
          in->last_progress = SteadyClock::now();
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = in.get();
          if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, in->fd.get(), &ev) != 0) {
            RDMAPS_PLOG(WARNING) << "tcp transport: cannot watch a served socket";
            CloseInbound(in, "epoll_ctl failed", true);
            continue;
          }
          inbound_[in.get()] = in;
        }
        ResumePaused();  // WaitNotifications drained the queue (or a spurious wake)
      } else if (tag == &kListenerTag) {
        AcceptNew();
      } else {
        auto it = inbound_.find(static_cast<Inbound*>(tag));
        if (it == inbound_.end()) continue;  // Closed earlier in this round.
        std::shared_ptr<Inbound> in = it->second;
        Handle(in, events[i].events);
      }
    }
    if ((!inbound_.empty() || listeners_paused_) && SteadyClock::now() >= next_sweep_) {
      ResumeListeners();
      Sweep();
      next_sweep_ = SteadyClock::now() + std::chrono::milliseconds(tick_ms);
    }
    // The round's responses are on the wire: now wake the notification
    // waiter (waking it first would delay the acknowledgements on a busy
    // machine).
    DeliverNotifications();
    graveyard_.clear();
  }
}

void EndpointCore::AcceptNew() {
  for (Fd& l : listeners_) {
    for (;;) {
      Fd accepted(::accept4(l.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!accepted.valid()) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) break;
        accept_errors_.fetch_add(1, std::memory_order_relaxed);
        if (err == EMFILE || err == ENFILE) {
          // The pending connection stays queued and the listener stays
          // readable: without shedding it, epoll would wake us at once, for
          // ever. Rate-limited: a flood would otherwise log per attempt.
          RDMAPS_LOG_EVERY_T(WARNING, 1.0)
              << "tcp transport: out of file descriptors ("
              << (err == EMFILE ? "EMFILE: raise `ulimit -n`" : "ENFILE: the system's limit")
              << "); closing the connections that arrive until some are free";
          ShedOnFdExhaustion(l.get());
        } else {
          errno = err;
          RDMAPS_PLOG_EVERY_T(WARNING, 1.0) << "tcp transport: accept failed";
        }
        break;
      }
      const int fd = accepted.get();
      if (handshaking_ >= kMaxHandshaking) DropOldestHandshake();
      auto in = std::make_shared<Inbound>();
      in->fd = std::move(accepted);
      SetNoDelay(fd);
      in->peer_address = PeerAddress(fd);
      in->phase = Inbound::Phase::kHello;
      in->deadline = DeadlineAfter(handshake_timeout_);
      in->last_progress = SteadyClock::now();
      in->accept_seq = ++accept_seq_;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = in.get();
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        RDMAPS_PLOG_EVERY_T(WARNING, 1.0) << "tcp transport: cannot watch an accepted socket";
        continue;
      }
      inbound_[in.get()] = std::move(in);
      ++handshaking_;
    }
  }
}

void EndpointCore::ShedOnFdExhaustion(int listener) {
  fd_exhaustion_sheds_.fetch_add(1, std::memory_order_relaxed);
  // The reserve-descriptor trick (libev, nginx): give up the spare, take
  // the connection, close it, take the spare back.
  reserve_fd_.Reset();
  const bool shed = Fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)).valid();
  reserve_fd_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!reserve_fd_.valid() || !shed) {
    // No spare to give up (another thread took it): stop watching the
    // listeners until a socket closes (Sweep re-arms them), rather than spin.
    for (Fd& l : listeners_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, l.get(), nullptr);
    listeners_paused_ = true;
  }
}

void EndpointCore::DropOldestHandshake() {
  std::shared_ptr<Inbound> oldest;
  for (auto& [ptr, in] : inbound_) {
    if (in->handshaking() && (!oldest || in->accept_seq < oldest->accept_seq)) oldest = in;
  }
  if (!oldest) return;
  handshakes_dropped_.fetch_add(1, std::memory_order_relaxed);
  RDMAPS_LOG_EVERY_T(WARNING, 1.0)
      << "tcp transport: " << handshaking_ << " sockets are in their handshake (the cap is "
      << kMaxHandshaking << "); dropping the oldest, from " << oldest->peer_address;
  CloseInbound(oldest, "", false);
}

void EndpointCore::Handle(const std::shared_ptr<Inbound>& in, std::uint32_t events) {
  if (in->handshaking()) {
    Status s = HandleHello(in);
    if (s.ok()) return;
    if (!in->refused) {
      CloseInbound(in, s.message(), s.code() != StatusCode::kCancelled);
      return;
    }
    // Let the refusal reach the peer before closing: closing with unread
    // bytes would reset the connection and could destroy the reply.
    handshakes_refused_.fetch_add(1, std::memory_order_relaxed);
    RDMAPS_LOG_EVERY_T(WARNING, 0.2)
        << "tcp transport: refused a connection from " << in->peer_address << ": " << s.message();
    --handshaking_;
    in->phase = Inbound::Phase::kDraining;
    in->deadline = DeadlineAfter(handshake_timeout_);
    in->rx_begin = in->rx_end = 0;
    s = Serve(*in);
    if (!s.ok()) {
      CloseInbound(in, s.message(), false);
      return;
    }
    UpdateEpoll(*in);
    return;
  }
  (void)events;
  Status s = Serve(*in);
  if (!s.ok()) {
    // A peer closing its end is normal; anything else is worth a warning.
    CloseInbound(in, s.message(), s.code() != StatusCode::kCancelled);
    return;
  }
  UpdateEpoll(*in);
}

void EndpointCore::UpdateEpoll(Inbound& in) {
  // Responses to send first; a paused inbound reads nothing.
  const std::uint32_t want = !in.tx.empty() ? EPOLLOUT : in.paused ? 0u : EPOLLIN;
  if (want == in.epoll_events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &in;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, in.fd.get(), &ev) == 0) in.epoll_events = want;
}

void EndpointCore::CloseInbound(const std::shared_ptr<Inbound>& in, const std::string& reason,
                                bool warn) {
  auto it = inbound_.find(in.get());
  if (it == inbound_.end()) return;
  if (in->handshaking()) --handshaking_;
  if (warn) {
    RDMAPS_LOG_EVERY_T(WARNING, 0.2)
        << "tcp transport: closing connection from " << in->peer_address
        << (in->paired ? " (peer " + std::to_string(in->peer_id) + ")" : std::string()) << ": "
        << reason;
  }
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, in->fd.get(), nullptr);
  {
    MutexLock lock(in->close_mu);
    in->closed = true;
    in->fd.Reset();
  }
  if (in->session != 0 && !in->paired) sessions_.erase(in->session);
  if (in->paired) {
    Notification n;
    n.kind = Notification::Kind::kDisconnected;
    n.peer_id = in->peer_id;
    n.connection = in->session;
    PushNotification(n);
  }
  graveyard_.push_back(in);
  inbound_.erase(it);
  ResumeListeners();
}

void EndpointCore::ResumeListeners() {
  if (!listeners_paused_) return;
  listeners_paused_ = false;
  for (Fd& l : listeners_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &kListenerTag;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, l.get(), &ev);
  }
}

void EndpointCore::Sweep() {
  const auto now = SteadyClock::now();
  std::vector<std::pair<std::shared_ptr<Inbound>, std::string>> expired;
  for (auto& [ptr, in] : inbound_) {
    switch (in->phase) {
      case Inbound::Phase::kHello:
      case Inbound::Phase::kProof:
        if (now >= in->deadline) {
          expired.emplace_back(in, "no complete handshake within " +
                                       std::to_string(handshake_timeout_.count()) + " ms");
        }
        break;
      case Inbound::Phase::kDraining:
        if (now >= in->deadline) expired.emplace_back(in, "");
        break;
      case Inbound::Phase::kServing: {
        // A paused inbound waits for our consumer, not for its peer.
        bool busy =
            !in->paused && (!in->tx.empty() || in->in_payload || in->rx_end != in->rx_begin);
        if (busy && now - in->last_progress >= options_.op_timeout) {
          expired.emplace_back(in, std::string(in->tx.empty() ? "peer stalled mid-frame"
                                                              : "peer stopped reading responses") +
                                       " for " + std::to_string(options_.op_timeout.count()) +
                                       " ms (op_timeout)");
        }
        break;
      }
    }
  }
  for (auto& [ptr, s] : sessions_) {
    if (now >= s.deadline && inbound_.count(s.ops.get())) {
      expired.emplace_back(s.ops, "peer opened its ops socket but not its reverse socket within " +
                                      std::to_string(handshake_timeout_.count()) + " ms");
    }
  }
  for (auto& [in, why] : expired) CloseInbound(in, why, !why.empty());
}

// ---------------------------------------------------------------------------
// Handshake, acceptor side (progress thread).

void EndpointCore::Reply(Inbound& in, StatusCode code, const std::string& message,
                         std::uint64_t session) {
  if (code != StatusCode::kOk) in.refused = true;
  HelloReply r;
  r.version = protocol_version();
  r.status = static_cast<std::uint8_t>(code);
  r.peer_id = options_.peer_id;
  r.message = message;
  r.session = session;
  const std::string buf = EncodeHelloReply(r);
  // A fresh socket's send buffer takes this whole; a short write only costs
  // the peer a clear error.
  ssize_t w = ::send(in.fd.get(), buf.data(), buf.size(), MSG_NOSIGNAL);
  (void)w;
}

Status EndpointCore::HandleHello(const std::shared_ptr<Inbound>& in) {
  ssize_t r = ::recv(in->fd.get(), in->rx.get() + in->rx_end, kRxBufferBytes - in->rx_end, 0);
  if (r == 0) return CancelledError("peer closed the socket during the handshake");
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::OK();
    return UnavailableError(std::string("recv during the handshake: ") + std::strerror(errno));
  }
  in->rx_end += static_cast<std::size_t>(r);
  if (in->phase == Inbound::Phase::kProof) return HandleProof(in);
  std::size_t avail = in->rx_end - in->rx_begin;
  if (avail < 4) return Status::OK();
  HelloWire h;
  std::memcpy(&h, in->rx.get(), std::min(avail, sizeof(h)));
  if (h.magic.get() != kHelloMagic) {
    return InvalidArgumentError("bad handshake magic (not an rdmaps tcp peer?)");
  }
  if (avail < sizeof(HelloWire)) return Status::OK();
  if (h.version.get() != protocol_version()) {
    std::string msg = "protocol version mismatch: peer speaks " + std::to_string(h.version.get()) +
                      ", this endpoint (peer " + std::to_string(options_.peer_id) + ") speaks " +
                      std::to_string(protocol_version()) +
                      "; run the same rdmaps release on every node";
    Reply(*in, StatusCode::kFailedPrecondition, msg, 0);
    return FailedPreconditionError(msg);
  }
  auto hello = ParseHello({in->rx.get(), sizeof(HelloWire)});
  if (!hello.ok()) {
    Reply(*in, StatusCode::kInvalidArgument, hello.status().message(), 0);
    return hello.status();
  }
  in->rx_begin += sizeof(HelloWire);
  in->hello = std::move(hello).value();
  in->peer_id = in->hello.peer_id;
  in->acceptor_nonce = RandomNonce();
  Challenge c;
  c.version = protocol_version();
  c.peer_id = options_.peer_id;
  c.nonce = in->acceptor_nonce;
  c.mac = TcpHandshakeMac(key_, MacDirection::kAcceptor, in->hello, c.nonce, options_.peer_id);
  const std::string buf = EncodeChallenge(c);
  // A fresh socket's send buffer takes this whole; a short write only costs
  // the peer its handshake deadline.
  ssize_t w = ::send(in->fd.get(), buf.data(), buf.size(), MSG_NOSIGNAL);
  (void)w;
  in->phase = Inbound::Phase::kProof;
  return HandleProof(in);
}

Status EndpointCore::HandleProof(const std::shared_ptr<Inbound>& in) {
  const std::size_t avail = in->rx_end - in->rx_begin;
  if (avail < sizeof(ProofWire)) return Status::OK();
  auto proof = ParseProof({in->rx.get() + in->rx_begin, sizeof(ProofWire)});
  if (!proof.ok()) {
    Reply(*in, StatusCode::kInvalidArgument, proof.status().message(), 0);
    return proof.status();
  }
  const std::uint32_t peer_id = in->hello.peer_id;
  const std::string who = "peer " + std::to_string(peer_id) + " at " + in->peer_address;
  if (proof->status != 0) {
    handshakes_refused_.fetch_add(1, std::memory_order_relaxed);
    return PermissionDeniedError(
        who + " refused this endpoint (peer " + std::to_string(options_.peer_id) +
        "): our proof of the job secret did not verify there, so the two processes have "
        "different job secrets; " +
        kJobSecretFix);
  }
  const Mac want = TcpHandshakeMac(key_, MacDirection::kConnector, in->hello, in->acceptor_nonce,
                                   options_.peer_id);
  if (!ConstantTimeEqual(want, proof->mac)) {
    std::string msg = "job secret mismatch: " + who +
                      " did not prove knowledge of the job secret of endpoint " +
                      std::to_string(options_.peer_id) + " (MAC mismatch); " + kJobSecretFix;
    Reply(*in, StatusCode::kPermissionDenied, msg, 0);
    return PermissionDeniedError(msg);
  }
  in->rx_begin += sizeof(ProofWire);
  Hello& hello = in->hello;
  if (hello.role == HelloRole::kOps) {
    std::uint64_t session;
    do {
      session = ++session_seed_ * 0x9E3779B97F4A7C15ull;
    } while (session == 0 || sessions_.count(session));
    Session s;
    s.ops = in;
    s.peer.peer_id = peer_id;
    s.peer.connection = session;
    s.peer.address = in->peer_address;
    s.peer.user_data = hello.user_data;
    s.deadline = in->deadline;
    sessions_[session] = std::move(s);
    in->session = session;
    in->phase = Inbound::Phase::kServing;
    --handshaking_;
    in->last_progress = SteadyClock::now();
    Reply(*in, StatusCode::kOk, "", session);
    // Requests may already follow the proof.
    if (in->rx_begin != in->rx_end) {
      Status st = Serve(*in);
      if (!st.ok()) return st;
      UpdateEpoll(*in);
    }
    return Status::OK();
  }
  // Reverse socket: pair it with its ops socket and hand it to a Connection.
  auto it = sessions_.find(hello.session);
  if (it == sessions_.end() || it->second.peer.peer_id != peer_id) {
    std::string msg = "unknown or expired session in the reverse-socket handshake; connect again";
    Reply(*in, StatusCode::kNotFound, msg, 0);
    return NotFoundError(msg);
  }
  if (in->rx_begin != in->rx_end) {
    return InvalidArgumentError("unexpected bytes after the reverse-socket handshake");
  }
  Session s = std::move(it->second);
  sessions_.erase(it);
  s.ops->paired = true;
  Reply(*in, StatusCode::kOk, "", hello.session);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, in->fd.get(), nullptr);
  --handshaking_;
  Fd fd;
  {
    MutexLock lock(in->close_mu);
    in->closed = true;
    fd = std::move(in->fd);
  }
  inbound_.erase(in.get());
  graveyard_.push_back(in);
  auto conn = std::make_unique<TcpConnection>(std::move(fd), std::move(s.peer), s.ops, options_,
                                              regions_.get());
  {
    MutexLock lock(mu_);
    accepted_.push_back(std::move(conn));
  }
  accept_cv_.notify_all();
  return Status::OK();
}

// ---------------------------------------------------------------------------
// The Endpoint.

namespace {

class TcpEndpoint final : public Endpoint {
 public:
  TcpEndpoint(const EndpointOptions& options, std::shared_ptr<EndpointCore> core)
      : Endpoint(options), core_(std::move(core)) {}
  ~TcpEndpoint() override { core_->Stop(); }

  std::string_view kind() const override { return "tcp"; }

  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, std::size_t length,
                                                 std::uint32_t access) override {
    if (addr == nullptr && length != 0) {
      return InvalidArgumentError("Register: null address with a non-zero length");
    }
    if ((access & ~static_cast<std::uint32_t>(kRemoteAll)) != 0) {
      return InvalidArgumentError("Register: unknown access bits; use a mask of Access values");
    }
    auto* base = static_cast<std::byte*>(addr);
    std::uint32_t key = core_->regions()->Add(base, length, access);
    return std::unique_ptr<MemoryRegion>(
        new TcpMemoryRegion(core_->regions(), base, length, access, key));
  }

  Result<std::string> DoListen(std::string_view address, const HostPort& hp) override {
    {
      MutexLock lock(mu_);
      if (listening_) {
        return FailedPreconditionError("Listen: this endpoint already listens; call it once");
      }
    }
    RDMAPS_ASSIGN_OR_RETURN(ResolvedAddress ra, Resolve(hp, address));
    Fd fd(::socket(ra.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoError("socket()", errno);
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ra.storage), ra.length) != 0) {
      int err = errno;
      return UnavailableError("Listen: cannot bind " + std::string(address) + ": " +
                              std::strerror(err) +
                              (err == EADDRINUSE ? "; pick another port or use port 0"
                                                 : "; check that the address is local"));
    }
    if (::listen(fd.get(), 512) != 0) return ErrnoError("listen()", errno);
    std::string bound = LocalAddress(fd.get());
    {
      MutexLock lock(mu_);
      if (listening_) {
        return FailedPreconditionError("Listen: this endpoint already listens; call it once");
      }
      listening_ = true;
    }
    core_->AdoptListener(std::move(fd));
    return bound;
  }

  Result<std::unique_ptr<Connection>> DoConnect(std::string_view address, const HostPort& hp,
                                                const ConnectOptions& options,
                                                Deadline deadline) override {
    RDMAPS_ASSIGN_OR_RETURN(ResolvedAddress ra, Resolve(hp, address));
    const std::string name(address);

    RDMAPS_ASSIGN_OR_RETURN(Fd ops, ConnectTo(ra, name, deadline));
    RDMAPS_ASSIGN_OR_RETURN(HelloReply r1,
                            Handshake(ops.get(), name, HelloRole::kOps, 0, options, deadline));
    RDMAPS_ASSIGN_OR_RETURN(Fd rev, ConnectTo(ra, name, deadline));
    RDMAPS_ASSIGN_OR_RETURN(HelloReply r2, Handshake(rev.get(), name, HelloRole::kReverse,
                                                     r1.session, options, deadline));
    if (r2.peer_id != r1.peer_id) {
      return UnavailableError("handshake with " + name +
                              ": the two sockets reached different peers");
    }
    PeerInfo peer;
    peer.peer_id = r1.peer_id;
    // The session names this connection on both sides: the immediates the
    // acceptor sends back carry it.
    peer.connection = r1.session;
    peer.address = PeerAddress(ops.get());
    auto served = std::make_shared<Inbound>();
    served->fd = std::move(rev);
    served->phase = Inbound::Phase::kServing;
    served->peer_id = peer.peer_id;
    served->session = r1.session;
    served->peer_address = peer.address;
    served->paired = true;
    core_->AdoptServed(served);
    return std::unique_ptr<Connection>(
        std::make_unique<TcpConnection>(std::move(ops), std::move(peer), std::move(served),
                                        this->options(), core_->regions().get()));
  }

  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    return core_->Accept(deadline);
  }

  Result<std::size_t> WaitNotifications(std::span<Notification> out, Deadline deadline) override {
    return core_->WaitNotifications(out, deadline);
  }

  void Interrupt() override { core_->Interrupt(); }

  EndpointCore& core() { return *core_; }

 private:
  // The connector's half of messages 1-4 of tcp_wire.h; returns the final
  // reply (its session, the acceptor's id).
  Result<HelloReply> Handshake(int fd, const std::string& name, HelloRole role,
                               std::uint64_t session, const ConnectOptions& options,
                               Deadline deadline) {
    Hello h;
    h.version = core_->protocol_version();
    h.role = role;
    h.peer_id = this->options().peer_id;
    h.session = session;
    h.user_data = options.user_data;
    h.nonce = RandomNonce();
    const std::string what = "handshake with " + name;
    std::string buf = EncodeHello(h);
    RDMAPS_RETURN_IF_ERROR(SendAll(fd, buf.data(), buf.size(), deadline, what));
    RDMAPS_ASSIGN_OR_RETURN(HelloReply first, RecvReply(fd, name, deadline));
    if (first.status != 0) {
      return Status(CodeFromWire(first.status),
                    "peer at " + name + " refused the connection: " + first.message);
    }
    if (first.version != core_->protocol_version()) {
      return FailedPreconditionError(what + ": protocol version mismatch: peer speaks " +
                                     std::to_string(first.version) + ", we speak " +
                                     std::to_string(core_->protocol_version()) +
                                     "; run the same rdmaps release on every node");
    }
    std::array<std::byte, sizeof(HelloReplyWire) + sizeof(ChallengeWire)> cbuf;
    HelloReplyWire fw{};  // re-encode the first part: ParseChallenge takes both
    fw.magic.set(kHelloMagic);
    fw.version.set(first.version);
    fw.peer_id.set(first.peer_id);
    std::memcpy(cbuf.data(), &fw, sizeof(fw));
    RDMAPS_RETURN_IF_ERROR(
        RecvAll(fd, cbuf.data() + sizeof(fw), sizeof(ChallengeWire), deadline, what));
    RDMAPS_ASSIGN_OR_RETURN(Challenge c, ParseChallenge(cbuf));
    const Mac want = TcpHandshakeMac(core_->key(), MacDirection::kAcceptor, h, c.nonce, c.peer_id);
    Proof p;
    if (!ConstantTimeEqual(want, c.mac)) {
      // Tell the acceptor why we hang up, so both sides log the cause.
      p.status = static_cast<std::uint8_t>(StatusCode::kPermissionDenied);
      buf = EncodeProof(p);
      (void)SendAll(fd, buf.data(), buf.size(), deadline, what);
      return PermissionDeniedError("job secret mismatch: peer " + std::to_string(c.peer_id) +
                                   " at " + name +
                                   " did not prove knowledge of this job's secret (MAC "
                                   "mismatch; this process is peer " +
                                   std::to_string(h.peer_id) + "); " + kJobSecretFix);
    }
    p.mac = TcpHandshakeMac(core_->key(), MacDirection::kConnector, h, c.nonce, c.peer_id);
    buf = EncodeProof(p);
    RDMAPS_RETURN_IF_ERROR(SendAll(fd, buf.data(), buf.size(), deadline, what));
    RDMAPS_ASSIGN_OR_RETURN(HelloReply r, RecvReply(fd, name, deadline));
    if (r.status != 0) {
      return Status(CodeFromWire(r.status),
                    "peer at " + name + " refused the connection: " + r.message);
    }
    if (r.peer_id != c.peer_id) {
      return UnavailableError(what + ": the peer changed its id during the handshake");
    }
    return r;
  }

  // A HelloReplyWire and its message.
  Result<HelloReply> RecvReply(int fd, const std::string& name, Deadline deadline) {
    const std::string what = "handshake with " + name;
    std::vector<std::byte> b(sizeof(HelloReplyWire));
    RDMAPS_RETURN_IF_ERROR(RecvAll(fd, b.data(), b.size(), deadline, what));
    HelloReplyWire w;
    std::memcpy(&w, b.data(), sizeof(w));
    if (w.magic.get() != kHelloMagic) {
      return UnavailableError(what + ": the peer is not an rdmaps tcp endpoint (bad magic)");
    }
    const std::size_t len = std::min<std::size_t>(w.message_len.get(), kMaxMessageBytes);
    b.resize(sizeof(w) + len);
    RDMAPS_RETURN_IF_ERROR(RecvAll(fd, b.data() + sizeof(w), len, deadline, what));
    if (len != w.message_len.get()) {
      return UnavailableError(what + ": malformed reply (message too long)");
    }
    auto r = ParseHelloReply(b);
    if (!r.ok()) return UnavailableError(what + ": " + r.status().message());
    return r;
  }

  std::shared_ptr<EndpointCore> core_;
  Mutex mu_;
  bool listening_ RDMAPS_GUARDED_BY(mu_) = false;
};

}  // namespace

Status TEST_SetProtocolVersion(Endpoint& endpoint, std::uint16_t version) {
  auto* tcp = dynamic_cast<TcpEndpoint*>(&endpoint);
  if (tcp == nullptr) {
    return InvalidArgumentError("TEST_SetProtocolVersion needs a tcp endpoint, not a '" +
                                std::string(endpoint.kind()) + "' one");
  }
  tcp->core().set_protocol_version(version);
  return Status::OK();
}

Result<TcpStats> TEST_GetTcpStats(Endpoint& endpoint) {
  auto* tcp = dynamic_cast<TcpEndpoint*>(&endpoint);
  if (tcp == nullptr) return InvalidArgumentError("TEST_GetTcpStats needs a tcp endpoint");
  EndpointCore& c = tcp->core();
  TcpStats s;
  s.accept_errors = c.accept_errors_.load();
  s.fd_exhaustion_sheds = c.fd_exhaustion_sheds_.load();
  s.handshakes_dropped = c.handshakes_dropped_.load();
  s.handshakes_refused = c.handshakes_refused_.load();
  s.acks_held = c.acks_held_.load();
  return s;
}

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options) {
  auto core = std::make_shared<EndpointCore>(options);
  RDMAPS_RETURN_IF_ERROR(core->Start());
  return std::unique_ptr<Endpoint>(std::make_unique<TcpEndpoint>(options, std::move(core)));
}

}  // namespace rdmaps::transport::tcp
