#pragma once
// The one text for a gRPC call's failure in our logs and reasons: the status code's name as
// gRPC spells it, then the message ("UNAVAILABLE: connections to all backends failing; ...").
// Library gns_grpc_server.

#include <grpcpp/support/status.h>

#include <string>

namespace gns {

std::string DescribeGrpcStatus(const grpc::Status& status);

}  // namespace gns
