// gns-csi-client: one CSI call to a plugin's unix socket, the way the kubelet makes it, with stubs
// generated from the CSI spec's own csi.proto (tests/data/csi, verbatim).
//
//   gns-csi-client --socket <path> <Method> [<request as JSON>] [--timeout-ms <n>]
//
// Method: GetPluginInfo, GetPluginCapabilities, Probe (Identity); NodeGetCapabilities,
// NodeGetInfo, NodePublishVolume, NodeUnpublishVolume (Node). The request is protobuf's JSON
// mapping of the request message ({} when left out). Prints one JSON line:
//   {"code": <grpc code>, "codeName": "...", "message": "...", "response": {...}}
// and exits 0 whenever the call got an answer (an error status is an answer); 2 on bad usage.
#include "csi.grpc.pb.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>

namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "?";
  }
}

// A JSON string literal (the status message may hold anything).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

int Usage(const std::string& why) {
  std::cerr << "gns-csi-client: " << why
            << "\nusage: gns-csi-client --socket <path> <Method> [<request JSON>] [--timeout-ms <n>]\n";
  return 2;
}

// One unary call: parse the request, call, print the outcome.
template <typename Request, typename Response, typename Call>
int Run(const std::string& json, Call call, int timeout_ms) {
  Request request;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &request);
  if (!parsed.ok()) return Usage("request: " + std::string(parsed.message()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  Response response;
  const grpc::Status status = call(&context, request, &response);
  std::string body = "{}";
  if (status.ok()) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    body.clear();
    (void)google::protobuf::util::MessageToJsonString(response, &body, options);
  }
  std::cout << "{\"code\":" << static_cast<int>(status.error_code()) << ",\"codeName\":\""
            << CodeName(status.error_code()) << "\",\"message\":" << Quote(status.error_message())
            << ",\"response\":" << body << "}" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  std::string method;
  std::string json = "{}";
  int timeout_ms = 30000;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (arg == "--timeout-ms" && i + 1 < argc) {
      timeout_ms = std::atoi(argv[++i]);
    } else if (positional == 0) {
      method = arg;
      ++positional;
    } else if (positional == 1) {
      json = arg;
      ++positional;
    } else {
      return Usage("unexpected argument " + arg);
    }
  }
  if (socket.empty() || method.empty()) return Usage("--socket and a method are required");
  if (timeout_ms <= 0) return Usage("--timeout-ms must be positive");
  auto channel = grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
  auto identity = csi::v1::Identity::NewStub(channel);
  auto node = csi::v1::Node::NewStub(channel);
  using namespace csi::v1;
  if (method == "GetPluginInfo") {
    return Run<GetPluginInfoRequest, GetPluginInfoResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return identity->GetPluginInfo(c, q, r); }, timeout_ms);
  }
  if (method == "GetPluginCapabilities") {
    return Run<GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return identity->GetPluginCapabilities(c, q, r); }, timeout_ms);
  }
  if (method == "Probe") {
    return Run<ProbeRequest, ProbeResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return identity->Probe(c, q, r); }, timeout_ms);
  }
  if (method == "NodeGetCapabilities") {
    return Run<NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return node->NodeGetCapabilities(c, q, r); }, timeout_ms);
  }
  if (method == "NodeGetInfo") {
    return Run<NodeGetInfoRequest, NodeGetInfoResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return node->NodeGetInfo(c, q, r); }, timeout_ms);
  }
  if (method == "NodePublishVolume") {
    return Run<NodePublishVolumeRequest, NodePublishVolumeResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return node->NodePublishVolume(c, q, r); }, timeout_ms);
  }
  if (method == "NodeUnpublishVolume") {
    return Run<NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return node->NodeUnpublishVolume(c, q, r); }, timeout_ms);
  }
  if (method == "NodeGetVolumeStats") {
    return Run<NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse>(
        json, [&](auto* c, const auto& q, auto* r) { return node->NodeGetVolumeStats(c, q, r); }, timeout_ms);
  }
  return Usage("unknown method " + method);
}
