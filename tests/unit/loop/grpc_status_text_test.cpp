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

TEST(DescribeGrpcStatus, ACodeBeyondTheKnownOnesIsGivenByNumber) {
  EXPECT_EQ(DescribeGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(42), "odd")), "code 42: odd");
}

}  // namespace
}  // namespace gns
