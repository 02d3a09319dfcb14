#include "loop/grpc_status_text.hpp"

#include <array>

namespace gns {

std::string DescribeGrpcStatus(const grpc::Status& status) {
  // Indexed by grpc::StatusCode, which follows google.rpc.Code (0 … 16).
  static constexpr std::array<const char*, 17> kNames = {
      "OK",           "CANCELLED",          "UNKNOWN",          "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND",    "ALREADY_EXISTS",     "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",      "OUT_OF_RANGE",       "UNIMPLEMENTED",    "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS",    "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  std::string text = code >= 0 && static_cast<std::size_t>(code) < kNames.size() ? std::string(kNames[code])
                                                                                   : "code " + std::to_string(code);
  if (!status.error_message().empty()) text += ": " + status.error_message();
  return text;
}

}  // namespace gns
