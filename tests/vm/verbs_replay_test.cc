// A connect request captured on the fabric and replayed, to the acceptor that
// saw it and to a restarted one (an empty replay cache): the replayer speaks
// raw rdma_cm with the captured REQ's bytes but does not know the job
// secret, so it cannot make the proof over the acceptor's fresh nonce that
// the verbs handshake asks for once the CM exchange is done
// (transport/verbs/verbs_wire.h). The acceptor must neither hand the
// connection up nor let the replayer's QP touch its memory, and must tear
// the connection down. Runs where an RDMA device exists (the Soft-RoCE VM in
// CI, tests/vm/); skips with the reason elsewhere.
#include <endian.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "src/base/host_port.h"
#include "src/base/secret.h"
#include "tests/vm/verbs_test_env.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace vw = verbs::internal;

constexpr char kToken[] = "replay-token";

// The REQ an honest connector with peer id 9 sent (what a capture holds).
std::vector<std::uint8_t> CapturedRequest() {
  vw::ConnectWire req{};
  req.magic = htobe32(vw::kConnectMagic);
  req.version = htobe16(kProtocolVersion);
  req.peer_id = htobe32(9);
  std::array<std::uint8_t, 8> nonce;
  RandomBytes(nonce);
  std::copy(nonce.begin(), nonce.end(), req.nonce);
  const auto mac = vw::ConnectMac(SecretKey::FromSecret(kToken), kProtocolVersion, nonce, 9, {});
  std::copy(mac.begin(), mac.end(), req.mac);
  std::vector<std::uint8_t> out(sizeof req);
  std::memcpy(out.data(), &req, sizeof req);
  return out;
}

// A replayer: raw rdma_cm with a QP of rdma_cm's own, no secret.
class Replayer {
 public:
  ~Replayer() {
    if (id_ != nullptr) {
      if (id_->qp != nullptr) rdma_destroy_qp(id_);
      if (mr_ != nullptr) ibv_dereg_mr(mr_);
      if (cq_ != nullptr) ibv_destroy_cq(cq_);
      rdma_destroy_id(id_);
    }
    if (ch_ != nullptr) rdma_destroy_event_channel(ch_);
  }

  // Sends `req` as the REQ's private data; returns the event that answered
  // it (ESTABLISHED or REJECTED) and the REJ's reason in *reject_reason.
  rdma_cm_event_type Connect(const std::string& address, const std::vector<std::uint8_t>& req,
                             int* reject_reason) {
    ch_ = rdma_create_event_channel();
    EXPECT_NE(ch_, nullptr);
    EXPECT_EQ(rdma_create_id(ch_, &id_, nullptr, RDMA_PS_TCP), 0);
    auto hp = ParseHostPort(address, "replay target");
    EXPECT_TRUE(hp.ok()) << hp.status();
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* ai = nullptr;
    EXPECT_EQ(getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &ai), 0);
    EXPECT_EQ(rdma_resolve_addr(id_, nullptr, ai->ai_addr, 5000), 0);
    freeaddrinfo(ai);
    EXPECT_EQ(Next(seconds(10)), RDMA_CM_EVENT_ADDR_RESOLVED);
    EXPECT_EQ(rdma_resolve_route(id_, 5000), 0);
    EXPECT_EQ(Next(seconds(10)), RDMA_CM_EVENT_ROUTE_RESOLVED);
    cq_ = ibv_create_cq(id_->verbs, 16, nullptr, nullptr, 0);
    EXPECT_NE(cq_, nullptr);
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_;
    qa.recv_cq = cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 8;
    qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    EXPECT_EQ(rdma_create_qp(id_, nullptr, &qa), 0) << std::strerror(errno);
    const int access = IBV_ACCESS_LOCAL_WRITE;  // an int: ibv_reg_mr ORs in flags of another enum
    mr_ = ibv_reg_mr(id_->qp->pd, buf_, sizeof buf_, access);
    EXPECT_NE(mr_, nullptr);
    rdma_conn_param p{};
    p.private_data = req.data();
    p.private_data_len = static_cast<std::uint8_t>(req.size());
    p.initiator_depth = 1;
    p.responder_resources = 1;
    p.retry_count = 2;
    p.rnr_retry_count = 2;
    EXPECT_EQ(rdma_connect(id_, &p), 0);
    rdma_cm_event_type t = Next(seconds(10), reject_reason);
    return t;
  }

  // The next CM event by `within`, or RDMA_CM_EVENT_TIMEWAIT_EXIT as "none".
  rdma_cm_event_type Next(milliseconds within, int* reject_reason = nullptr) {
    pollfd pfd{ch_->fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(within.count())) <= 0) {
      return RDMA_CM_EVENT_TIMEWAIT_EXIT;
    }
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch_, &ev) != 0) return RDMA_CM_EVENT_TIMEWAIT_EXIT;
    rdma_cm_event_type t = ev->event;
    if (reject_reason != nullptr && t == RDMA_CM_EVENT_REJECTED &&
        ev->param.conn.private_data_len >= sizeof(vw::RejectWire)) {
      vw::RejectWire rej;
      std::memcpy(&rej, ev->param.conn.private_data, sizeof rej);
      *reject_reason = be32toh(rej.magic) == vw::kRejectMagic ? rej.reason : -1;
    }
    rdma_ack_cm_event(ev);
    return t;
  }

  // One signaled op; its completion status.
  ibv_wc_status Post(ibv_wr_opcode op, std::uint32_t imm, std::uint64_t remote_addr,
                     std::uint32_t rkey) {
    ibv_sge sge{reinterpret_cast<std::uint64_t>(buf_), sizeof buf_, mr_->lkey};
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htobe32(imm);
    if (op == IBV_WR_RDMA_WRITE) {
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = remote_addr;
      wr.wr.rdma.rkey = rkey;
    }
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(id_->qp, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    const Deadline deadline = DeadlineAfter(seconds(20));
    ibv_wc wc{};
    while (SteadyClock::now() < deadline) {
      int n = ibv_poll_cq(cq_, 1, &wc);
      if (n > 0) return wc.status;
      if (n < 0) break;
      std::this_thread::yield();
    }
    return IBV_WC_GENERAL_ERR;
  }

  std::uint8_t buf_[8] = {0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee};

 private:
  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
};

class VerbsReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!VerbsUsable(&why)) GTEST_SKIP() << "verbs not usable here: " << why;
    addr_ = rdmaps::testing::VerbsTestAddress(&why);
    if (addr_.empty()) GTEST_SKIP() << why;
  }

  // An acceptor; op_timeout 2 s makes its proof deadline 2 s.
  std::unique_ptr<Endpoint> Acceptor(std::string* listen) {
    EndpointOptions o;
    o.transport = "verbs";
    o.peer_id = 1;
    o.job_token = kToken;
    o.op_timeout = milliseconds(2000);
    auto ep = Endpoint::Create(o);
    EXPECT_TRUE(ep.ok()) << ep.status();
    auto l = (*ep)->Listen(addr_ + ":0");
    EXPECT_TRUE(l.ok()) << l.status();
    *listen = *l;
    return std::move(ep).value();
  }

  std::string addr_;
};

TEST_F(VerbsReplayTest, ReplayedRequestIsRefusedByTheAcceptorThatSawItAndARestartedOne) {
  const std::vector<std::uint8_t> req = CapturedRequest();
  std::uint64_t target = 0x1111111111111111ull;

  // A fresh acceptor (empty replay cache) accepts the REQ at the CM level;
  // the replayer's WRITE into registered memory is refused by the NIC, the
  // connection is never handed up, and the acceptor disconnects it when the
  // proof does not come.
  {
    std::string listen;
    auto acceptor = Acceptor(&listen);
    auto mr = acceptor->Register(&target, sizeof target, kRemoteWrite);
    ASSERT_TRUE(mr.ok()) << mr.status();
    Replayer r;
    ASSERT_EQ(r.Connect(listen, req, nullptr), RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_NE(r.Post(IBV_WR_RDMA_WRITE, 0, reinterpret_cast<std::uint64_t>(&target), (*mr)->rkey()),
              IBV_WC_SUCCESS);
    EXPECT_EQ(target, 0x1111111111111111ull);
    auto a = acceptor->Accept(DeadlineAfter(seconds(4)));
    EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
    EXPECT_EQ(r.Next(seconds(10)), RDMA_CM_EVENT_DISCONNECTED);
  }

  // Restarted: a new acceptor, an empty cache. A wrong proof (the replayer
  // has no secret) is refused at once; the same REQ again hits the cache.
  std::string listen;
  auto acceptor = Acceptor(&listen);
  {
    Replayer r;
    ASSERT_EQ(r.Connect(listen, req, nullptr), RDMA_CM_EVENT_ESTABLISHED);
    for (std::size_t i = 0; i < vw::kProofWords; ++i) {
      ASSERT_EQ(r.Post(IBV_WR_SEND_WITH_IMM, 0x12345678u + i, 0, 0), IBV_WC_SUCCESS);
    }
    EXPECT_EQ(r.Next(seconds(10)), RDMA_CM_EVENT_DISCONNECTED);
    auto a = acceptor->Accept(DeadlineAfter(milliseconds(500)));
    EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
  }
  {
    Replayer r;
    int reason = 0;
    EXPECT_EQ(r.Connect(listen, req, &reason), RDMA_CM_EVENT_REJECTED);
    EXPECT_EQ(reason, vw::kRejectReplay);
  }

  // An honest connector still gets in, and its first op - right after
  // Connect returns - finds the remote access granted.
  auto mr = acceptor->Register(&target, sizeof target, kRemoteWrite);
  ASSERT_TRUE(mr.ok()) << mr.status();
  EndpointOptions o;
  o.transport = "verbs";
  o.peer_id = 2;
  o.job_token = kToken;
  auto client = Endpoint::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto c = (*client)->Connect(listen, {}, DeadlineAfter(seconds(10)));
  ASSERT_TRUE(c.ok()) << c.status();
  std::uint64_t value = 0x2222222222222222ull;
  auto lmr = (*client)->Register(&value, sizeof value, 0);
  ASSERT_TRUE(lmr.ok()) << lmr.status();
  Op w;
  w.type = OpType::kWrite;
  w.local = &value;
  w.local_mr = lmr->get();
  w.length = sizeof value;
  w.remote_addr = reinterpret_cast<std::uint64_t>(&target);
  w.rkey = (*mr)->rkey();
  ASSERT_TRUE((*c)->Post(std::span(&w, 1)).ok());
  Completion done[1];
  auto got = (*c)->Wait(done, DeadlineAfter(seconds(20)));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(target, 0x2222222222222222ull);
  auto a = acceptor->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peer().peer_id, 2u);
}

}  // namespace
}  // namespace rdmaps::transport
