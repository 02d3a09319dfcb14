// DescribeGrpcStatus: the code's name as gRPC spells it, then the message.
#include "loop/grpc_status_text.hpp"

#include <gtest/gtest.h>

namespace gns {
namespace {

TEST(DescribeGrpcStatus, NamesTheCodeAndKeepsTheMessage) {
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connections to all backends failing")),
            "UNAVAILABLE: connections to all backends failing");
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")), "DEADLINE_EXCEEDED");
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no")), "UNAUTHENTICATED: no");
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status::OK), "OK");
}

// 20: past the named codes but inside the enum's range (a value outside it would be undefined).
TEST(DescribeGrpcStatus, ACodeBeyondTheKnownOnesIsGivenByNumber) {
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd")), "code 20: odd");
}

}  // namespace
}  // namespace gns
