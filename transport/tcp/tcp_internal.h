// Internals of the tcp backend, shared by its setup code (tcp_transport.cc)
// and its data path (tcp_datapath.cc). See tcp_wire.h for the protocol and
// docs/tcp-protocol.md for the design.
//
// Threads: each Endpoint runs one progress thread. It owns the listener, the
// sockets still in their handshake, and every "served" socket (the sockets on
// which peers post ops against this endpoint's memory), all in one epoll set.
// A Connection owns its initiator socket and drives it from the calling
// thread (Post/Poll/Wait), so no socket is shared between threads.
#pragma once

#include <sys/epoll.h>
#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "src/base/mutex.h"
#include "src/base/secret.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_socket.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace rdmaps::transport::tcp {

// READ responses up to this size are copied into the response buffer; larger
// ones are sent straight from registered memory.
inline constexpr std::size_t kCopyThreshold = 8 * 1024;
// Receive buffer of a served socket and of an initiator socket. Large
// payloads bypass it (readv straight into their destination), so it only
// needs to hold headers and small payloads.
inline constexpr std::size_t kRxBufferBytes = 64 * 1024;
// A readv that puts a large payload straight into its destination reads at
// most this much of what follows into the receive buffer: enough for the
// next few headers, little enough that the next large payload (pipelined
// push slots, back-to-back READ responses) also goes straight into place
// instead of being received into the buffer and copied (a second copy of
// nearly every 64 KiB push slot otherwise).
inline constexpr std::size_t kDirectLookahead = 1024;
// Acknowledgements a served socket holds back while it reads the payload of
// the next WRITE (sent together once the socket is empty, or this many are
// held): fewer than half the window a pipelining initiator waits for
// (src/ps/push_writer.h completes half of its 16 slots at a time), so the
// pipe never drains for an acknowledgement.
inline constexpr std::size_t kMaxHeldAcks = 4;
// A Wait spins for EndpointOptions::busy_poll only while the ops
// outstanding on the connection carry at most this many payload bytes; with
// more (a long push's window: 16 slots of 64 KiB, half of it still
// outstanding when it waits), it sleeps in poll(2) at once. On a 2-core box
// a spinning initiator took a core from the peer's receive and apply: a
// 4 MiB push (64 slots in a window of 16) cost 3.3-5.5 ms of CPU with
// spinning waits, 2.5-2.9 ms without (docs/ps.md, "How a long push
// waits"). Single ops up to this size still spin: at 128 KiB a 256 KiB
// pull (256x256) was 10-20% slower on an idle box than with its spin.
inline constexpr std::uint64_t kSpinMaxPendingBytes = 512 * 1024;
// A served socket stops executing requests while this many response bytes
// wait to be sent (it resumes when the peer reads).
inline constexpr std::size_t kMaxTxBacklog = 4 << 20;
// Accepted sockets still in their handshake; more are refused at once.
inline constexpr std::size_t kMaxHandshaking = 1024;

// What the progress thread checks inbound ops against.
struct RegionEntry {
  std::byte* base = nullptr;
  std::size_t size = 0;
  std::uint32_t access = 0;
};

// rkey -> region. Registration and deregistration take mu_ exclusively; the
// progress thread holds it shared while it touches registered memory, so a
// region's memory is never accessed once its deregistration has returned.
class RegionTable {
 public:
  RegionTable();
  std::uint32_t Add(std::byte* base, std::size_t size, std::uint32_t access);
  void Remove(std::uint32_t rkey);
  SharedMutex& mu() const RDMAPS_RETURN_CAPABILITY(mu_) { return mu_; }
  // Null when absent.
  const RegionEntry* FindLocked(std::uint32_t rkey) const RDMAPS_REQUIRES_SHARED(mu_);

 private:
  mutable SharedMutex mu_;
  std::unordered_map<std::uint32_t, RegionEntry> regions_ RDMAPS_GUARDED_BY(mu_);
  std::uint32_t next_rkey_ RDMAPS_GUARDED_BY(mu_);
};

class TcpMemoryRegion final : public MemoryRegion {
 public:
  TcpMemoryRegion(std::shared_ptr<RegionTable> table, std::byte* data, std::size_t size,
                  std::uint32_t access, std::uint32_t key)
      : MemoryRegion(data, size, access, key, key), table_(std::move(table)) {}
  ~TcpMemoryRegion() override { table_->Remove(rkey()); }
  const RegionTable* table() const { return table_.get(); }

 private:
  std::shared_ptr<RegionTable> table_;
};

// Bytes waiting to be sent on a socket: owned bytes (headers, small
// payloads) interleaved with external ranges (a caller's WRITE payload, or
// registered memory for a large READ response), sent with one sendmsg per
// Flush where they fit. Single-threaded.
class TxQueue {
 public:
  TxQueue();
  // Room for n owned bytes at the end; valid until the next Append.
  std::byte* AppendOwned(std::size_t n);
  // `rkey_or_zero` marks registered memory that must be revalidated.
  void AppendExternal(const void* p, std::size_t n, std::uint32_t rkey_or_zero);
  bool empty() const { return head_ == segs_.size(); }
  bool HasRegionRanges() const { return region_ranges_ > 0; }
  // Whether an unsent range into registered memory overlaps [p, p + n).
  bool RegionRangesOverlap(const std::byte* p, std::size_t n) const;
  std::size_t owned_bytes() const { return own_.size(); }
  // True when every pending range into registered memory is still registered.
  bool RegionRangesValid(const RegionTable& table) const RDMAPS_REQUIRES_SHARED(table.mu());
  // Sends what the socket takes. True when the queue is now empty, false when
  // the socket is full; Unavailable when the socket failed.
  Result<bool> Flush(int fd);

 private:
  struct Segment {
    const std::byte* ptr;  // External, or null when owned.
    std::size_t offset;    // Owned: offset into own_.
    std::size_t length;
    std::uint32_t rkey;
  };
  void Clear();
  std::vector<std::byte> own_;
  std::vector<Segment> segs_;
  std::size_t head_ = 0;       // First unsent segment.
  std::size_t head_sent_ = 0;  // Bytes of segs_[head_] already sent.
  std::size_t region_ranges_ = 0;
};

// A socket served by the progress thread: first an accepted socket in its
// handshake, then one on which a peer posts ops against this endpoint.
struct Inbound {
  // kHello: waiting for the Hello; kProof: challenge sent, waiting for the
  // connector's proof; both count as handshaking.
  enum class Phase { kHello, kProof, kServing, kDraining };

  Inbound();
  // Shuts the socket down from any thread (Connection::Close); the progress
  // thread notices and closes it.
  void Shutdown();

  Mutex close_mu;
  bool closed RDMAPS_GUARDED_BY(close_mu) = false;
  // Written (closed, moved out) under close_mu and by the progress thread
  // only, which alone reads it without close_mu; Shutdown reads it under
  // close_mu from any thread.
  Fd fd;

  // Progress thread only.
  Phase phase = Phase::kHello;
  bool handshaking() const { return phase == Phase::kHello || phase == Phase::kProof; }
  Hello hello;                   // kProof: the connector's hello.
  Nonce acceptor_nonce;          // kProof: ours.
  std::uint64_t accept_seq = 0;  // Order of arrival, to drop the oldest handshake.
  Deadline deadline{};           // Hello and draining phases: when to give up.
  SteadyClock::time_point last_progress{};
  std::uint32_t peer_id = 0;
  std::string peer_address;
  bool paired = false;   // Part of an established Connection: report kDisconnected.
  bool refused = false;  // Its handshake was answered with a refusal.
  std::uint64_t session = 0;
  std::uint32_t epoll_events = EPOLLIN;  // What epoll watches for now.
  // Not reading: its next request is a WRITE_WITH_IMM and the notification
  // queue is full (EndpointOptions::max_queued_notifications).
  bool paused = false;
  bool paused_listed = false;  // In EndpointCore::paused_.
  std::unique_ptr<std::byte[]> rx;
  std::size_t rx_begin = 0;
  std::size_t rx_end = 0;
  // A WRITE whose payload is still arriving.
  bool in_payload = false;
  RequestWire payload_req{};
  std::uint64_t payload_done = 0;
  // The last payload was read straight into place: the next recv into rx
  // takes only kDirectLookahead (another large payload likely follows).
  bool after_direct = false;
  TxQueue tx;
};

// The initiator side of a Connection. Owned by one thread at a time.
class TcpConnection final : public Connection {
 public:
  TcpConnection(Fd fd, PeerInfo peer, std::shared_ptr<Inbound> served,
                const EndpointOptions& options, const RegionTable* table);
  ~TcpConnection() override;

  Status Post(std::span<const Op> ops) override;
  std::size_t Poll(std::span<Completion> out) override;
  Result<std::size_t> Wait(std::span<Completion> out, Deadline deadline) override;
  void set_busy_poll(std::chrono::microseconds spin) override { busy_poll_ = spin; }
  std::size_t outstanding() const override { return pending_.size() + ready_.size(); }
  std::size_t max_outstanding() const override { return max_outstanding_; }
  std::size_t max_segments() const override { return kMaxSegments; }
  const PeerInfo& peer() const override { return peer_; }
  Status health() const override { return health_; }
  void Close() override;

 private:
  struct Pending {
    std::uint64_t context;
    OpType type;
    std::byte* local;
    std::uint32_t length;
    SteadyClock::time_point posted;
    std::uint32_t num_segments;  // A scattered READ's, at the front of segments_.
  };
  // Segments one READ may scatter into; a response fills them with one
  // readv when it is large.
  static constexpr std::size_t kMaxSegments = 1024;
  // A scattered READ is received straight into its segments only when they
  // average at least this much.
  static constexpr std::size_t kDirectSegmentBytes = 4096;
  Status Validate(const Op& op) const;
  Status ValidateLocal(const void* addr, const MemoryRegion* local_mr, std::uint64_t length) const;
  // Puts the next n payload bytes of the READ at the head where they belong
  // (src null: a readv already did) and advances payload_done_ and the
  // segment cursor.
  void TakePayload(const Pending& p, const std::byte* src, std::size_t n);
  // Reads the rest of the head READ's payload straight into its buffer (and
  // what follows into rx_). False when the connection failed.
  bool ReadPayloadDirect(const Pending& p, std::uint32_t len);
  // Sends queued requests and consumes arrived responses, without blocking.
  void Progress();
  // Consumes responses in rx_; reads more when `may_read`. False on error.
  void ReadResponses();
  void CompleteHead(Status status);
  // Puts the connection in error: `first` for the oldest op (if any), then
  // `rest` for the others, and closes the socket.
  void Fail(Status first, StatusCode rest_code, const std::string& rest_message);
  std::size_t Drain(std::span<Completion> out);
  std::string Describe() const;

  // Constant after construction.
  const std::size_t max_outstanding_;
  const std::chrono::milliseconds op_timeout_;
  std::chrono::microseconds busy_poll_;  // (set_busy_poll changes it: the caller's thread)
  const RegionTable* const table_;
  const PeerInfo peer_;
  const std::shared_ptr<Inbound> served_;

  // Owner thread only.
  Fd fd_;
  Status health_;
  bool closed_ = false;
  std::deque<Pending> pending_;
  // The bytes of the ops in pending_ (their payloads, either direction):
  // Wait spins only while they are few (kSpinMaxPendingBytes).
  std::uint64_t pending_bytes_ = 0;
  // The local sides of the scattered READs in pending_, in posting order.
  std::deque<Segment> segments_;
  std::vector<iovec> iov_;  // ReadPayloadDirect's scratch
  std::deque<Completion> ready_;
  TxQueue tx_;
  std::unique_ptr<std::byte[]> rx_;
  std::size_t rx_begin_ = 0;
  std::size_t rx_end_ = 0;
  bool have_header_ = false;
  ResponseWire header_{};
  std::uint32_t payload_done_ = 0;
  // As Inbound::after_direct, for READ responses.
  bool after_direct_ = false;
  // Where payload_done_ falls in the head READ's segments.
  std::size_t seg_index_ = 0;
  std::size_t seg_offset_ = 0;
  std::string error_payload_;
};

// An Endpoint's shared state and its progress thread. Shared with the
// Endpoint, its MemoryRegions (through the RegionTable) and nothing else.
class EndpointCore {
 public:
  explicit EndpointCore(EndpointOptions options);
  ~EndpointCore();
  Status Start();
  void Stop();

  const EndpointOptions& options() const { return options_; }
  const std::shared_ptr<RegionTable>& regions() const { return regions_; }
  const SecretKey& key() const { return key_; }

  // Hands a listening socket or an established served socket to the
  // progress thread.
  void AdoptListener(Fd fd);
  // Announced in handshakes and required of peers (tests change it).
  std::uint16_t protocol_version() const { return protocol_version_.load(); }
  void set_protocol_version(std::uint16_t v) { protocol_version_.store(v); }
  void AdoptServed(std::shared_ptr<Inbound> in);

  // Queues a notification; the progress thread hands the queued ones to
  // waiters after the round's responses are sent (DeliverNotifications), so
  // an initiator's completion never waits for the target's wake-up. Progress
  // thread only.
  void PushNotification(const Notification& n);
  void DeliverNotifications();
  // True when no further notification may be queued (progress thread).
  bool NotificationsFull() const {
    return queued_notes_.load() + round_notes_.size() >= options_.max_queued_notifications;
  }
  // Serves the inbounds paused by a full queue again (progress thread).
  void ResumePaused();
  Result<std::size_t> WaitNotifications(std::span<Notification> out, Deadline deadline);
  Result<std::unique_ptr<Connection>> Accept(Deadline deadline);
  void Interrupt();

  // Serves a socket in kServing/kDraining (tcp_datapath.cc). Progress thread
  // only. Not OK when the socket must be closed (the message says why).
  Status Serve(Inbound& in);

 private:
  struct Session {
    std::shared_ptr<Inbound> ops;
    PeerInfo peer;
    Deadline deadline;
  };
  void Run();
  void Wake();
  void AcceptNew();
  void Handle(const std::shared_ptr<Inbound>& in, std::uint32_t events);
  // Hello and proof phases: reads and answers a Hello, then checks the
  // connector's proof. Not OK: close the socket.
  Status HandleHello(const std::shared_ptr<Inbound>& in);
  Status HandleProof(const std::shared_ptr<Inbound>& in);
  // Too many handshakes: closes the one that started first, so idle sockets
  // cannot lock real peers out.
  void DropOldestHandshake();
  // accept4 failed with EMFILE/ENFILE: frees the reserve descriptor to take
  // and close one pending connection, so the listener stops being readable
  // (level-triggered epoll would otherwise spin).
  void ShedOnFdExhaustion(int listener);
  // Watches the listeners again after ShedOnFdExhaustion paused them.
  void ResumeListeners();
  void Reply(Inbound& in, StatusCode code, const std::string& message, std::uint64_t session);
  void UpdateEpoll(Inbound& in);
  void CloseInbound(const std::shared_ptr<Inbound>& in, const std::string& reason, bool warn);
  void Sweep();
  // Executes one request whose header was consumed (tcp_datapath.cc).
  // Both run inside Serve, which holds the region table shared.
  Status Execute(Inbound& in, const RequestWire& req) RDMAPS_REQUIRES_SHARED(regions_->mu());
  // Whether mutation `req` (fenced, or a WRITE or atomic on bytes an unsent
  // READ response of `in` still points at) must wait for those responses.
  bool MayChangePendingReads(const Inbound& in, const RequestWire& req) const
      RDMAPS_REQUIRES_SHARED(regions_->mu());
  Status ContinuePayload(Inbound& in, bool* blocked) RDMAPS_REQUIRES_SHARED(regions_->mu());
  void FinishWrite(Inbound& in);
  void ErrorResponse(Inbound& in, std::uint8_t opcode, const Status& status);
  void Enqueue(Inbound& in, std::uint8_t opcode, std::uint8_t status, std::uint32_t length,
               std::uint64_t value);

  // Constant after construction.
  const EndpointOptions options_;
  const std::shared_ptr<RegionTable> regions_;
  const std::chrono::milliseconds handshake_timeout_;
  const SecretKey key_;
  std::atomic<std::uint16_t> protocol_version_{kProtocolVersion};

  Fd epoll_;
  Fd wake_fd_;
  std::thread thread_;

  Mutex mu_;
  // Two condition variables, so that a notification wakes only the thread
  // waiting for notifications, not an Accept waiter too (and vice versa).
  std::condition_variable accept_cv_;
  std::condition_variable notes_cv_;
  bool stop_ RDMAPS_GUARDED_BY(mu_) = false;
  std::vector<Fd> new_listeners_ RDMAPS_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Inbound>> new_served_ RDMAPS_GUARDED_BY(mu_);
  std::deque<Notification> notifications_ RDMAPS_GUARDED_BY(mu_);
  // Progress thread only: notifications of the current round, in order.
  std::vector<Notification> round_notes_;
  // Progress thread only: inbounds paused because the queue was full.
  std::vector<Inbound*> paused_;
  // notifications_.size(), readable without mu_; and whether any inbound is
  // paused (WaitNotifications wakes the progress thread when it drains).
  std::atomic<std::size_t> queued_notes_{0};
  std::atomic<bool> any_paused_{false};
  std::deque<std::unique_ptr<Connection>> accepted_ RDMAPS_GUARDED_BY(mu_);
  // Sticky until a waiter returns because of it.
  bool interrupted_ RDMAPS_GUARDED_BY(mu_) = false;
  bool listening_ RDMAPS_GUARDED_BY(mu_) = false;

  // Progress thread only.
  std::vector<Fd> listeners_;
  std::unordered_map<Inbound*, std::shared_ptr<Inbound>> inbound_;
  std::unordered_map<std::uint64_t, Session> sessions_;
  std::size_t handshaking_ = 0;  // Inbounds in kHello or kProof.
  std::uint64_t accept_seq_ = 0;
  Fd reserve_fd_;                  // /dev/null, given up when accept4 meets EMFILE.
  bool listeners_paused_ = false;  // Out of descriptors even for the shed.
  std::vector<std::shared_ptr<Inbound>> graveyard_;  // Closed this round.
  std::uint64_t session_seed_;
  SteadyClock::time_point next_sweep_{};

 public:
  // Counters for tests (TEST_TcpStats), any thread.
  std::atomic<std::uint64_t> accept_errors_{0};        // accept4 failures
  std::atomic<std::uint64_t> fd_exhaustion_sheds_{0};  // connections shed at EMFILE
  std::atomic<std::uint64_t> handshakes_dropped_{0};   // oldest dropped at the cap
  std::atomic<std::uint64_t> handshakes_refused_{0};   // bad secret, version, format
  std::atomic<std::uint64_t> acks_held_{0};  // Serve held acknowledgements back (kMaxHeldAcks)
};

// noinline so that ThreadSanitizer reports of the by-design race between
// these syscalls and the target CPU name them (see docs/tcp-protocol.md).
ssize_t RacySendmsg(int fd, const msghdr* msg);
ssize_t RacyReadv(int fd, const iovec* iov, int count);

}  // namespace rdmaps::transport::tcp
