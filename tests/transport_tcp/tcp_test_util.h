// Helpers for the tcp backend's own tests: endpoints on 127.0.0.1:0, a
// connected pair with registered buffers, and raw sockets speaking (or
// abusing) the wire protocol of transport/tcp/tcp_wire.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/tcp_socket.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace rdmaps::transport::tcp::testing {

inline constexpr const char* kToken = "tcp-test-token";

std::unique_ptr<Endpoint> MakeEndpoint(
    std::uint32_t peer_id, std::chrono::milliseconds op_timeout = std::chrono::seconds(20));

// A listening server with a registered 64 KiB buffer (kRemoteAll), and a
// client connected to it with its own registered 64 KiB buffer.
// `server_op_timeout` also bounds the server's handshake and stall deadlines;
// the client keeps a generous op_timeout so loaded CI machines stay green.
struct Pair {
  explicit Pair(std::chrono::milliseconds server_op_timeout = std::chrono::seconds(20));
  std::unique_ptr<Endpoint> server;
  std::unique_ptr<Endpoint> client;
  std::string address;
  std::vector<std::byte> remote;
  std::vector<std::byte> local;
  std::unique_ptr<MemoryRegion> rmr;
  std::unique_ptr<MemoryRegion> lmr;
  std::unique_ptr<Connection> conn;      // Client -> server.
  std::unique_ptr<Connection> accepted;  // Server -> client.
};

// Posts one op and waits for its completion (5 s deadline).
Status RunOne(Connection& conn, const Op& op);

// A raw TCP socket to `address` (blocking, 5 s timeouts); invalid on error.
Fd RawConnect(const std::string& address);
// Runs the connector's side of the handshake for `role` with `token` as the
// secret (sending its proof whether or not the acceptor's MAC verified);
// returns the final reply's status (kOk = accepted) and its session id.
// `sent`, if set, receives every byte written (to replay them).
// `reflect`: send the acceptor's own MAC back as the proof.
struct RawReply {
  std::uint8_t status = 0xff;
  std::uint64_t session = 0;
  std::string message;
  bool acceptor_mac_ok = false;  // the challenge's MAC verified with `token`
};
RawReply RawHello(int fd, HelloRole role, std::uint64_t session, const std::string& token = kToken,
                  std::uint16_t version = kProtocolVersion, std::uint32_t peer_id = 77,
                  std::string* sent = nullptr, bool reflect = false);
// Sends `bytes` (e.g. a captured handshake) and reads the acceptor's
// challenge and its final reply.
RawReply RawReplay(int fd, const std::string& bytes);
// The acceptor's side on an accepted raw socket: reads a hello, sends a
// challenge with `token`, checks the proof, replies OK with `session`.
// False when any step fails.
bool RawAccept(int fd, std::uint32_t my_id, std::uint64_t session,
               const std::string& token = kToken);
bool SendBytes(int fd, const void* p, std::size_t n);
// True when the peer closed the socket (EOF or reset) within 5 s, reading
// and discarding what arrives first.
bool WaitClosed(int fd);

}  // namespace rdmaps::transport::tcp::testing
