// rdmaps::Fd (src/base/fd.h) closes what it owns exactly once.
#include "src/base/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <utility>

namespace rdmaps {
namespace {

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int OpenPipeEnd(int* other) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  *other = fds[1];
  return fds[0];
}

TEST(FdTest, ClosesOnDestruction) {
  int w = -1;
  const int r = OpenPipeEnd(&w);
  ASSERT_GE(r, 0);
  {
    Fd owner(r);
    EXPECT_TRUE(owner.valid());
    EXPECT_EQ(owner.get(), r);
  }
  EXPECT_FALSE(IsOpen(r));
  Fd w_owner(w);
}

TEST(FdTest, MovesOwnershipAndReleases) {
  int w = -1;
  const int r = OpenPipeEnd(&w);
  ASSERT_GE(r, 0);
  Fd a(r);
  Fd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.get(), r);
  Fd c;
  c = std::move(b);
  EXPECT_EQ(c.get(), r);
  EXPECT_EQ(c.Release(), r);
  EXPECT_FALSE(c.valid());
  EXPECT_TRUE(IsOpen(r));  // released, not closed
  c.Reset(r);
  c.Reset(w);  // closes r, owns w
  EXPECT_FALSE(IsOpen(r));
  EXPECT_TRUE(IsOpen(w));
  c.Reset();
  EXPECT_FALSE(IsOpen(w));
}

}  // namespace
}  // namespace rdmaps
