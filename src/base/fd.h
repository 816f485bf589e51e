// An owned file descriptor: a socket, an eventfd, a pipe end. Closed when the
// owner goes away, so no error path leaks one and none is closed twice.
//
//   Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
//   if (!sock.valid()) return ErrnoError("socket", errno);
//   ...
//   return sock;  // moves; the caller owns it now
//
// Thread safety: a value owned by one thread at a time, like a unique_ptr.
#pragma once

namespace rdmaps {

class Fd {
 public:
  Fd() = default;
  // Takes ownership of `fd` (-1 for none).
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the descriptor held, if any, and owns `fd` instead.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

}  // namespace rdmaps
