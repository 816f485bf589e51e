#include "src/ps/server_links.h"

#include <algorithm>
#include <cstring>

namespace rdmaps::internal {

using transport::Completion;
using transport::Deadline;
using transport::Op;

std::string ServerName(const ServerLink& s) {
  return "server " + std::to_string(s.index) + " (" + s.address + ")";
}

Status ServerLinks::Fail(ServerLink& s, const Status& st) {
  Status err = st.WithContext("worker " + std::to_string(worker_id_) + ", " + ServerName(s));
  if (broken_.ok()) {
    broken_ = Status(StatusCode::kUnavailable,
                     "an earlier transport error broke this Client: " + err.ToString());
  }
  return err;
}

Status ServerLinks::PostOps(ServerLink& s, std::span<const Op> ops) {
  Status st = s.conn->Post(ops);
  if (!st.ok()) return Fail(s, st);
  return Status::OK();
}

Status ServerLinks::Drain(ServerLink& s, std::size_t n, Deadline deadline) {
  std::size_t completed = 0;
  return DrainSome(s, n, n, &completed, deadline);
}

Status ServerLinks::DrainSome(ServerLink& s, std::size_t at_least, std::size_t at_most,
                              std::size_t* completed, Deadline deadline) {
  Completion c[64];
  std::size_t got = 0;
  Status first;
  while (got < at_least) {
    auto r = s.conn->Wait({c, std::min<std::size_t>(at_most - got, 64)}, deadline);
    if (!r.ok()) return Fail(s, r.status());
    if (*r == 0) return Fail(s, TimedOutError("no completion by the deadline"));
    for (std::size_t i = 0; i < *r; ++i) {
      if (!c[i].status.ok() && first.ok()) first = c[i].status;
    }
    got += *r;
  }
  *completed += got;
  if (!first.ok()) return Fail(s, first);
  return Status::OK();
}

Status ServerLinks::Exec(ServerLink& s, std::span<const Op> ops, Deadline deadline) {
  RDMAPS_RETURN_IF_ERROR(PostOps(s, ops));
  return Drain(s, ops.size(), deadline);
}

bool ServerLinks::ParseControl(ServerLink& s) {
  const std::uint32_t W = s.dir.num_workers;
  if (!VerifyBlock(s.ctrl.get(), ControlPayloadBytes(W))) return false;
  const std::byte* p = s.ctrl.get() + sizeof(BlockHeader);
  ControlHead head;
  std::memcpy(&head, p, sizeof(head));
  std::memcpy(s.clocks.data(), p + sizeof(head), W * sizeof(ControlWorker));
  // The newest knowledge wins (a piggybacked read may be older than a poll).
  s.min_clock = std::max(s.min_clock, head.min_clock);
  s.applied_seq = std::max(s.applied_seq, s.clocks[worker_id_].applied_seq);
  return true;
}

Status ServerLinks::ReadControl(const std::vector<std::uint32_t>& servers, Deadline deadline) {
  std::vector<std::uint32_t> todo = servers;
  while (!todo.empty()) {
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      const Op op = Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr,
                             s.dir.control.rkey);
      RDMAPS_RETURN_IF_ERROR(PostOps(s, {&op, 1}));
    }
    std::vector<std::uint32_t> torn;
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      RDMAPS_RETURN_IF_ERROR(Drain(s, 1, deadline));
      if (!ParseControl(s)) torn.push_back(i);
    }
    stats_->Update([&](ClientStats& st) {
      st.clock_reads += todo.size();
      st.torn_retries += torn.size();
    });
    if (!torn.empty() && std::chrono::steady_clock::now() >= deadline) {
      return TimedOutError("the control block of server " + std::to_string(torn[0]) +
                           " stayed torn until the deadline");
    }
    todo = std::move(torn);
  }
  return Status::OK();
}

}  // namespace rdmaps::internal
