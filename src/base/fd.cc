#include "src/base/fd.h"

#include <unistd.h>

namespace rdmaps {

void Fd::Reset(int fd) {
  // close(2) releases the descriptor even when it reports EINTR on Linux, so
  // it is never retried (a retry could close a descriptor another thread just
  // opened).
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

}  // namespace rdmaps
