#include "rdmaps/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace rdmaps {
namespace {

TEST(StatusTest, DefaultIsOkAndHasEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = TimedOutError("waiting for worker 3");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kTimedOut);
  EXPECT_EQ(s.ToString(), "TimedOut: waiting for worker 3");
}

TEST(StatusTest, CopyIsDeep) {
  Status a = IOError("disk");
  Status b = a;
  a = Status::OK();
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(b.message(), "disk");
}

TEST(StatusTest, WithContextPrefixesAndKeepsOk) {
  EXPECT_TRUE(Status::OK().WithContext("ctx").ok());
  EXPECT_EQ(NotFoundError("table 7").WithContext("pull").message(), "pull: table 7");
}

TEST(StatusTest, ErrnoErrorMapsCommonCodes) {
  EXPECT_EQ(ErrnoError("connect", ECONNREFUSED).code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoError("mr", ENOMEM).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError("open", EACCES).code(), StatusCode::kPermissionDenied);
  EXPECT_NE(ErrnoError("connect", ECONNREFUSED).message().find("errno 111"), std::string::npos);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  RDMAPS_ASSIGN_OR_RETURN(int h, Half(x));
  RDMAPS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  RDMAPS_RETURN_IF_ERROR(Half(x));
  return Status::OK();
}

TEST(ResultTest, ValueAndErrorPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_FALSE(CheckEven(3).ok());
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r{Status::OK()};
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = NotFoundError("x");
  EXPECT_DEATH((void)r.value(), "NotFound: x");
}

}  // namespace
}  // namespace rdmaps
