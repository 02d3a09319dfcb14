// The fake kubelet's CSI volume plugin (csi.h): inline ephemeral volumes published on and
// unpublished from a registered CSI node plugin, as pkg/volume/csi (csi_mounter.go SetUpAt /
// TearDownAt) does, with the CSI spec's own stubs.
#include "csi.h"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <system_error>

#include <google/protobuf/util/json_util.h>

#include "csi.grpc.pb.h"
#include "kubelet_sim_impl.h"

namespace gns::sim {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kVolData = "vol_data.json";

json ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(message, &text, print).ok()) return json();
  return json::parse(text, nullptr, false);
}

std::optional<CsiDriverState> Driver(KubeletSim& sim, const std::string& name) {
  const KubeletState state = sim.State();
  auto it = state.csi_drivers.find(name);
  if (it == state.csi_drivers.end()) return std::nullopt;
  return it->second;
}

// vol_data.json, written as the kubelet writes it before the publish (atomically here).
bool WriteVolData(const fs::path& dir, const json& data, std::string& error) {
  const fs::path tmp = dir / (std::string(kVolData) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << data.dump();
    if (!out.flush()) {
      error = "cannot write " + tmp.string();
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, dir / kVolData, ec);
  if (ec) error = "cannot write " + (dir / kVolData).string() + ": " + ec.message();
  return !ec;
}

// removeMountDir: vol_data.json and the directories that are empty. Never recursive: the target
// may still be a mount point (seen from another mount namespace), and nothing under a mount
// point is ours to delete.
void RemoveVolumeDir(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / "mount", ec);  // rmdir: fails on a non-empty (still mounted) target, which then stays
  fs::remove(dir / kVolData, ec);
  fs::remove(dir, ec);
}

}  // namespace

void EnableCsi(KubeletSimOptions& options, std::chrono::milliseconds timeout) {
  options.csi_node_info = [timeout](const std::string& driver, const std::string& endpoint,
                                    std::string& node_id) -> std::string {
    auto node = csi::v1::Node::NewStub(detail::DialUnix(endpoint));
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(timeout));
    csi::v1::NodeGetInfoResponse response;
    const grpc::Status status = node->NodeGetInfo(&context, csi::v1::NodeGetInfoRequest{}, &response);
    if (!status.ok()) return "NodeGetInfo of " + driver + ": " + detail::ToRpcStatus(status).ToString();
    if (response.node_id().empty()) return "NodeGetInfo of " + driver + ": an empty node id";
    node_id = response.node_id();
    return "";
  };
}

std::string CsiVolumeHandle(const std::string& pod_uid, const std::string& volume_name) {
  const std::string input = pod_uid + volume_name;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(input.data(), input.size(), digest, &length, EVP_sha256(), nullptr);
  std::string out = "csi-";
  char hex[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", digest[i]);
    out += hex;
  }
  return out;
}

fs::path CsiTargetPath(const fs::path& kubelet_dir, const std::string& pod_uid, const std::string& volume_name) {
  return kubelet_dir / "pods" / pod_uid / "volumes" / "kubernetes.io~csi" / volume_name / "mount";
}

CsiVolumeResult CsiPublish(KubeletSim& sim, const CsiPodVolume& volume, std::chrono::milliseconds timeout) {
  CsiVolumeResult result;
  if (volume.pod_uid.empty() || volume.volume_name.empty() || volume.pod_uid.find('/') != std::string::npos ||
      volume.volume_name.find('/') != std::string::npos) {
    result.status = RpcStatus{grpc::StatusCode::INVALID_ARGUMENT, "a pod uid and a volume name (no '/') are needed"};
    return result;
  }
  result.volume_id = CsiVolumeHandle(volume.pod_uid, volume.volume_name);
  const fs::path target = CsiTargetPath(sim.KubeletDir(), volume.pod_uid, volume.volume_name);
  result.target_path = target.string();
  const auto driver = Driver(sim, volume.driver);
  if (!driver) {
    // csi_plugin.go: the driver is looked up among the registered ones first.
    result.status = RpcStatus{grpc::StatusCode::FAILED_PRECONDITION,
                              "driver name " + volume.driver + " not found in the list of registered CSI drivers"};
    return result;
  }
  const fs::path dir = target.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::permissions(dir, fs::perms(0750), ec);
  std::string error;
  const json vol_data = {{"driverName", volume.driver},
                         {"volumeHandle", result.volume_id},
                         {"specVolID", volume.volume_name},
                         {"volumeLifecycleMode", "Ephemeral"}};
  if (ec || !WriteVolData(dir, vol_data, error)) {
    result.status = RpcStatus{grpc::StatusCode::INTERNAL, ec ? "cannot make " + dir.string() + ": " + ec.message() : error};
    return result;
  }

  auto channel = detail::DialUnix(driver->endpoint);
  auto node = csi::v1::Node::NewStub(channel);
  {
    // NodeSupportsStageUnstage, asked on every SetUp; an ephemeral volume is never staged.
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(timeout));
    csi::v1::NodeGetCapabilitiesResponse capabilities;
    const grpc::Status status = node->NodeGetCapabilities(&context, csi::v1::NodeGetCapabilitiesRequest{}, &capabilities);
    if (!status.ok()) {
      result.status = detail::ToRpcStatus(status);
      result.status.message = "NodeGetCapabilities: " + result.status.message;
      RemoveVolumeDir(dir);
      return result;
    }
  }
  csi::v1::NodePublishVolumeRequest request;
  request.set_volume_id(result.volume_id);
  request.set_target_path(result.target_path);
  request.set_readonly(volume.read_only);
  auto* capability = request.mutable_volume_capability();
  capability->mutable_mount()->set_fs_type(volume.fs_type);
  capability->mutable_access_mode()->set_mode(csi::v1::VolumeCapability::AccessMode::SINGLE_NODE_WRITER);
  auto& context_map = *request.mutable_volume_context();
  for (const auto& [key, value] : volume.attributes) context_map[key] = value;
  if (volume.pod_info_on_mount) {
    context_map["csi.storage.k8s.io/pod.name"] = volume.pod_name;
    context_map["csi.storage.k8s.io/pod.namespace"] = volume.pod_namespace;
    context_map["csi.storage.k8s.io/pod.uid"] = volume.pod_uid;
    context_map["csi.storage.k8s.io/serviceAccount.name"] = volume.service_account;
    context_map["csi.storage.k8s.io/ephemeral"] = "true";
  }
  result.request = ProtoJson(request);
  grpc::ClientContext context;
  context.set_deadline(detail::Deadline(timeout));
  csi::v1::NodePublishVolumeResponse response;
  result.status = detail::ToRpcStatus(node->NodePublishVolume(&context, request, &response));
  if (!result.status.ok()) RemoveVolumeDir(dir);
  return result;
}

CsiVolumeResult CsiUnpublish(KubeletSim& sim, const std::string& pod_uid, const std::string& volume_name,
                             std::chrono::milliseconds timeout) {
  CsiVolumeResult result;
  const fs::path target = CsiTargetPath(sim.KubeletDir(), pod_uid, volume_name);
  const fs::path dir = target.parent_path();
  result.target_path = target.string();
  json vol_data;
  {
    std::ifstream in(dir / kVolData);
    if (!in) return result;  // nothing of ours there: nothing to tear down
    vol_data = json::parse(in, nullptr, false);
  }
  if (!vol_data.is_object() || !vol_data.contains("driverName") || !vol_data.contains("volumeHandle")) {
    result.status = RpcStatus{grpc::StatusCode::INTERNAL, (dir / kVolData).string() + " does not parse"};
    return result;
  }
  const std::string driver_name = vol_data.value("driverName", "");
  result.volume_id = vol_data.value("volumeHandle", "");
  const auto driver = Driver(sim, driver_name);
  if (!driver) {
    result.status = RpcStatus{grpc::StatusCode::FAILED_PRECONDITION,
                              "driver name " + driver_name + " not found in the list of registered CSI drivers"};
    return result;
  }
  csi::v1::NodeUnpublishVolumeRequest request;
  request.set_volume_id(result.volume_id);
  request.set_target_path(result.target_path);
  result.request = ProtoJson(request);
  auto node = csi::v1::Node::NewStub(detail::DialUnix(driver->endpoint));
  grpc::ClientContext context;
  context.set_deadline(detail::Deadline(timeout));
  csi::v1::NodeUnpublishVolumeResponse response;
  result.status = detail::ToRpcStatus(node->NodeUnpublishVolume(&context, request, &response));
  if (result.status.ok()) RemoveVolumeDir(dir);
  return result;
}

namespace {

std::string TakeWord(std::string_view& rest) {
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  std::size_t end = 0;
  while (end < rest.size() && rest[end] != ' ' && rest[end] != '\t') ++end;
  std::string word(rest.substr(0, end));
  rest.remove_prefix(end);
  return word;
}

json Reply(const CsiVolumeResult& r) {
  json out = {{"ok", r.status.ok()}, {"volume_id", r.volume_id}, {"target_path", r.target_path}};
  if (!r.status.ok()) {
    out["code"] = std::string(StatusCodeName(r.status.code));
    out["error"] = r.status.message;
  }
  if (!r.request.is_null()) out["request"] = r.request;
  return out;
}

// Every volume with a vol_data.json under <kubelet>/pods.
json Volumes(KubeletSim& sim) {
  json out = json::array();
  std::error_code ec;
  for (fs::directory_iterator pod(sim.KubeletDir() / "pods", ec), end; !ec && pod != end; pod.increment(ec)) {
    std::error_code inner;
    const fs::path csi_dir = pod->path() / "volumes" / "kubernetes.io~csi";
    for (fs::directory_iterator v(csi_dir, inner), vend; !inner && v != vend; v.increment(inner)) {
      std::ifstream in(v->path() / kVolData);
      const json data = json::parse(in, nullptr, false);
      if (!data.is_object()) continue;
      out.push_back(json{{"pod_uid", pod->path().filename().string()},
                         {"volume", v->path().filename().string()},
                         {"driver", data.value("driverName", "")},
                         {"volume_id", data.value("volumeHandle", "")},
                         {"target_path", (v->path() / "mount").string()}});
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> HandleCsiCommand(KubeletSim& sim, std::string_view line,
                                            const std::function<void(std::string_view)>& log) {
  std::string_view rest = line;
  const std::string command = TakeWord(rest);
  if (command != "csi-publish" && command != "csi-unpublish" && command != "csi-volumes") return std::nullopt;
  json reply;
  try {
    if (command == "csi-volumes") {
      reply = json{{"ok", true}, {"volumes", Volumes(sim)}};
    } else if (command == "csi-unpublish") {
      const std::string uid = TakeWord(rest);
      const std::string name = TakeWord(rest);
      if (uid.empty() || name.empty() || !TakeWord(rest).empty()) {
        reply = json{{"ok", false}, {"error", "usage: csi-unpublish POD_UID VOLUME"}};
      } else {
        const auto r = CsiUnpublish(sim, uid, name);
        reply = Reply(r);
        if (log) log("csi: NodeUnpublishVolume " + r.volume_id + " " + r.target_path + ": " + r.status.ToString());
      }
    } else {
      CsiPodVolume v;
      std::string word = TakeWord(rest);
      for (; word.starts_with("--"); word = TakeWord(rest)) {
        if (word == "--readonly") {
          v.read_only = true;
        } else if (word == "--no-pod-info") {
          v.pod_info_on_mount = false;
        } else if (word.starts_with("--fs-type=")) {
          v.fs_type = word.substr(10);
        } else {
          throw std::runtime_error("unknown option " + word);
        }
      }
      v.driver = word;
      const std::string pod = TakeWord(rest);
      v.pod_uid = TakeWord(rest);
      v.volume_name = TakeWord(rest);
      const std::size_t slash = pod.find('/');
      if (v.driver.empty() || slash == std::string::npos || slash == 0 || slash + 1 == pod.size() ||
          v.volume_name.empty()) {
        throw std::runtime_error(
            "usage: csi-publish [--readonly] [--no-pod-info] [--fs-type=T] DRIVER NS/POD POD_UID VOLUME [ATTRIBUTES_JSON]");
      }
      v.pod_namespace = pod.substr(0, slash);
      v.pod_name = pod.substr(slash + 1);
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
      if (!rest.empty()) {
        const json attributes = json::parse(rest);
        if (!attributes.is_object()) throw std::runtime_error("ATTRIBUTES_JSON must be an object of strings");
        for (const auto& [key, value] : attributes.items()) {
          if (!value.is_string()) throw std::runtime_error("volume attribute " + key + " is not a string");
          v.attributes[key] = value.get<std::string>();
        }
      }
      const auto r = CsiPublish(sim, v);
      reply = Reply(r);
      if (log) log("csi: NodePublishVolume " + v.driver + " " + v.pod_namespace + "/" + v.pod_name + " volume " +
                   v.volume_name + " -> " + r.target_path + ": " + r.status.ToString());
    }
  } catch (const std::exception& e) {
    reply = json{{"ok", false}, {"error", e.what()}};
  }
  return reply.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace gns::sim
