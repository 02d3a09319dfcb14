// A fake kubelet for tests and `make run`: it speaks the real kubelet wire protocols on real unix
// sockets (device plugin v1beta1 registration + ListAndWatch, the plugin watcher's
// pluginregistration GetInfo/NotifyRegistrationStatus, DRA NodePrepare/NodeUnprepare v1 and
// v1beta1), records what the plugins tell it and lets a test drive the calls a real kubelet makes
// while admitting pods. See README.md in this folder and WIRE-FACTS.md §1-§3.
//
// Every public method is thread-safe. The simulator runs its own threads (a gRPC server, one
// reader thread per ListAndWatch stream, an inotify watcher and a registration worker); callbacks
// given in the options run on those threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/support/status_code_enum.h>

#include "deviceplugin/v1beta1/api.pb.h"

namespace gns::sim {

using SteadyTime = std::chrono::steady_clock::time_point;

// DRA gRPC service names as a plugin advertises them in PluginInfo.supported_versions (§3.1).
inline constexpr std::string_view kDraV1Service = "v1.DRAPlugin";
inline constexpr std::string_view kDraV1beta1Service = "v1beta1.DRAPlugin";
// KEP-4680: the device-health service a DRA plugin may advertise beside its DRA service, in the
// versions kubelets know (1.34/1.35: v1alpha1; later: v1 and v1beta1).
inline constexpr std::string_view kDraHealthServiceV1 = "v1.DRAResourceHealth";
inline constexpr std::string_view kDraHealthServiceV1beta1 = "v1beta1.DRAResourceHealth";
inline constexpr std::string_view kDraHealthServiceV1alpha1 = "v1alpha1.DRAResourceHealth";
// The kubelet reads a device Unknown once its last report is older than this, unless a v1beta1/v1
// report names its own timeout (pkg/kubelet/cm/dra/healthinfo.go, healthTimeout).
inline constexpr std::chrono::milliseconds kDraHealthDefaultTimeout{30000};
// The plugin-watcher type of a CSI node plugin (kubelet pkg/volume/csi: RegistrationHandler).
inline constexpr std::string_view kPluginTypeCsi = "CSIPlugin";

struct KubeletSimOptions {
  // The kubelet root, e.g. <sandbox>/var/lib/kubelet: device-plugins/ and plugins_registry/
  // live under it.
  std::filesystem::path kubelet_dir;
  // DRA services this kubelet speaks, in its own preference order. {v1, v1beta1} is a 1.34+
  // kubelet; {v1beta1} a 1.32/1.33 one.
  std::vector<std::string> dra_services{std::string(kDraV1Service), std::string(kDraV1beta1Service)};
  // kubelet.sock exists this long before anyone listens on it: a kubelet between its bind()
  // and listen() (in the real one microseconds to milliseconds, enough for a plugin that dials
  // on the file's creation to be refused). Zero: bound and listening at once, by gRPC.
  std::chrono::milliseconds registration_listen_delay{0};
  // Blocking dial of a device plugin (kubelet: 10 s) and of a registration socket (10 s).
  std::chrono::milliseconds dial_timeout{10000};
  // Plugin watcher: GetInfo during registration (kubelet: 1 s after the dial),
  // NotifyRegistrationStatus (5 s), and the monitor's GetInfo probe (10 s).
  std::chrono::milliseconds getinfo_timeout{1000};
  std::chrono::milliseconds notify_timeout{5000};
  std::chrono::milliseconds probe_timeout{10000};
  // Periodic GetInfo probe of registered plugin sockets (newer kubelets: every 10 s; two
  // consecutive failures deregister the plugin). Zero: only ProbePluginSockets() probes.
  std::chrono::milliseconds probe_interval{0};
  // A failed plugin-watcher registration is retried from GetInfo on, as the kubelet's reconciler
  // does, with this backoff doubling up to registration_retry_max. Zero: no retries.
  std::chrono::milliseconds registration_retry_initial{500};
  std::chrono::milliseconds registration_retry_max{30000};
  // Allocate / GetPreferredAllocation / PreStartContainer, and DRA prepare/unprepare (45 s).
  std::chrono::milliseconds device_plugin_call_timeout{30000};
  std::chrono::milliseconds dra_call_timeout{45000};
  // Refuse a DRA plugin whose endpoint is not (yet) a socket at registration. Stricter than the
  // kubelet, which connects lazily; it catches a plugin that registers before it serves.
  bool check_dra_endpoint = true;
  // As kubelets with ResourceHealthStatus on: a DRA plugin that lists one of
  // `dra_health_services` in its supported_versions gets a NodeWatchResources stream in the first
  // of them it lists, once registered (one per registration; it is not re-dialled when it ends).
  bool watch_dra_health = true;
  // The health versions this kubelet knows, the one it prefers first ({v1alpha1}: a 1.34 kubelet).
  std::vector<std::string> dra_health_services{std::string(kDraHealthServiceV1), std::string(kDraHealthServiceV1beta1),
                                               std::string(kDraHealthServiceV1alpha1)};
  // A report without a timeout of its own reads Unknown this long after it arrived.
  std::chrono::milliseconds dra_health_timeout = kDraHealthDefaultTimeout;
  // Refuse GetPreferredAllocation / PreStartContainer locally (FAILED_PRECONDITION) unless the
  // plugin advertised them in its options, as the kubelet never calls them otherwise.
  bool strict_options = true;
  // CSI: the kubelet's CSI handler calls NodeGetInfo on a CSIPlugin's endpoint as it registers
  // it (csi_plugin.go RegisterPlugin -> nim.InstallCSIDriver) and refuses the registration when
  // that fails. The call needs the CSI spec's stubs, which live in gns_sim_kubelet_csi (csi.h
  // there: EnableCsi sets this), not in this library: a test process that also links our
  // own csi.proto text would register the package twice. Returns "" and the node id, or the
  // error. Empty: CSIPlugin sockets are validated and recorded without the call.
  std::function<std::string(const std::string& driver, const std::string& endpoint, std::string& node_id)>
      csi_node_info;
  // ListAndWatch messages kept per resource (older ones are dropped; the count goes on).
  std::size_t max_updates = 10000;
  // Plugin-watcher events kept.
  std::size_t max_watcher_events = 1000;
  // Serve PodResourcesLister v1 on <kubelet>/pod-resources/kubelet.sock (WIRE-FACTS §5).
  // False makes a kubelet without that socket (StartPodResources() can open it later).
  bool serve_pod_resources = true;
  // One readable line per registration, ListAndWatch update, disconnect, restart. Calls are
  // serialised by the simulator, so the callback need not be thread-safe; it runs on the
  // simulator's threads and must not call back into it.
  std::function<void(std::string_view line)> log;
};

// The outcome of one gRPC call (or a local refusal, with the code the kubelet would surface).
struct RpcStatus {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  bool ok() const { return code == grpc::StatusCode::OK; }
  std::string ToString() const;  // "OK" or "INVALID_ARGUMENT: message"
};

std::string_view StatusCodeName(grpc::StatusCode code);  // "INVALID_ARGUMENT"

template <typename Response>
struct RpcResult {
  RpcStatus status;
  Response response;
  bool ok() const { return status.ok(); }
};

// ---- device plugin side -------------------------------------------------------------------

struct DeviceInfo {
  std::string id;
  std::string health;  // "Healthy" / "Unhealthy" as sent (not validated)
  std::vector<std::int64_t> numa_nodes;
  bool operator==(const DeviceInfo&) const = default;
};

struct DevicePluginOptions {
  bool pre_start_required = false;
  bool get_preferred_allocation_available = false;
  bool operator==(const DevicePluginOptions&) const = default;
};

struct ListAndWatchUpdate {
  SteadyTime received;  // steady_clock when the message was read off the stream
  std::uint64_t connection = 0;  // ResourceState::connection it arrived on
  std::vector<DeviceInfo> devices;
};

struct ResourceState {
  std::string resource;
  std::string endpoint;  // socket path dialled
  std::string registration_socket;  // non-empty when it came through plugins_registry
  bool connected = false;  // the ListAndWatch stream is open
  int registrations = 0;   // successful registrations, over every restart
  std::uint64_t connection = 0;  // increases with every successful registration
  DevicePluginOptions options;  // from GetDevicePluginOptions at the last registration
  SteadyTime registered_at{};
  std::vector<DeviceInfo> devices;  // latest list (kept after a disconnect, as the kubelet does)
  std::uint64_t list_and_watch_messages = 0;  // every message, over every connection
  std::deque<ListAndWatchUpdate> updates;  // the newest max_updates messages, oldest first
  int disconnects = 0;  // streams that ended without the kubelet dropping them
  std::string disconnect_reason;  // "" while connected
  SteadyTime disconnected_at{};

  std::size_t CountHealth(std::string_view health) const;
  const DeviceInfo* FindDevice(std::string_view id) const;
};

struct RejectedRegistration {
  SteadyTime at{};
  std::string resource;
  std::string version;
  std::string endpoint;
  RpcStatus status;  // what the plugin got back
};

// ---- plugin watcher / DRA side ------------------------------------------------------------

struct PluginInfoView {
  std::string type;
  std::string name;
  std::string endpoint;
  std::vector<std::string> supported_versions;
};

struct DraEndpointState {
  std::string endpoint;  // the DRA socket
  std::string registration_socket;
  std::string service;  // chosen: "v1.DRAPlugin" or "v1beta1.DRAPlugin"
  std::vector<std::string> supported_versions;
  SteadyTime registered_at{};
};

// One device of a NodeWatchResources message, as received.
struct DraDeviceHealth {
  std::string pool_name;
  std::string device_name;
  std::string health;  // "UNKNOWN", "HEALTHY", "UNHEALTHY" (the enum's names)
  std::int64_t last_updated_time = 0;  // Unix seconds
  std::int64_t health_check_timeout_seconds = 0;  // v1beta1/v1; 0 = the kubelet's default
  std::string message;                            // v1beta1/v1
  SteadyTime received{};                          // when the message holding it was read
  // What the kubelet shows for the device at `now`: `health`, or "UNKNOWN" once the report is
  // older than its timeout (its own, else `default_timeout`).
  std::string SeenAt(SteadyTime now, std::chrono::milliseconds default_timeout) const;
  // The moment the report runs out (SeenAt reads "UNKNOWN" after it).
  SteadyTime ExpiresAt(std::chrono::milliseconds default_timeout) const;
};

struct DraDriverState {
  std::string driver;
  std::vector<DraEndpointState> endpoints;  // registered endpoints, oldest first
  int registrations = 0;  // over every restart
  // KEP-4680 health stream (KubeletSimOptions::watch_dra_health).
  int health_streams = 0;  // NodeWatchResources streams opened, over every registration
  bool health_stream_open = false;
  std::string health_service;  // the version of the last stream ("v1.DRAResourceHealth", …)
  // KubeletSimOptions::dra_health_timeout, for DraDeviceHealth::SeenAt.
  std::chrono::milliseconds health_default_timeout = kDraHealthDefaultTimeout;
  std::uint64_t health_messages = 0;  // over every stream
  std::vector<DraDeviceHealth> health;  // the last complete list received
  std::string health_stream_end;  // how the last stream ended ("" while none ended)
  const DraDeviceHealth* FindHealth(std::string_view device) const;
  bool registered() const { return !endpoints.empty(); }
  const DraEndpointState* Latest() const { return endpoints.empty() ? nullptr : &endpoints.back(); }
};

// A registered CSI node plugin (plugin-watcher type CSIPlugin).
struct CsiDriverState {
  std::string driver;
  std::string endpoint;             // the CSI socket (the registration socket when none is given)
  std::string registration_socket;
  std::vector<std::string> versions;  // as offered
  std::string highest_version;      // the highest 1.x offered: what the kubelet keeps
  std::string node_id;              // NodeGetInfo's answer at registration
  int registrations = 0;            // over every restart
};

// One socket in plugins_registry that has answered GetInfo at least once.
struct PluginSocketState {
  std::string socket;
  PluginInfoView info;  // from the last GetInfo that answered
  bool registered = false;
  int registrations = 0;
  int attempts = 0;  // registration attempts (GetInfo calls made to register it)
  int getinfo_ok = 0;  // answered GetInfo calls (registration and probes)
  int getinfo_failures = 0;
  int consecutive_probe_failures = 0;
  RpcStatus last_getinfo;
  bool last_notified_registered = false;  // what NotifyRegistrationStatus told the plugin
  std::string last_notified_error;
  RpcStatus last_notify;  // the plugin's answer to it
};

struct PluginWatcherEvent {
  enum class Kind { kRegistered, kRejected, kGetInfoFailed, kDeregistered, kProbeFailed };
  Kind kind = Kind::kRejected;
  SteadyTime at{};
  std::string socket;
  PluginInfoView info;
  std::string service;  // DRA: the chosen service
  std::string error;
  RpcStatus notify;  // the plugin's answer to NotifyRegistrationStatus (if one was sent)
};
std::string_view ToString(PluginWatcherEvent::Kind kind);

// ---- pod resources (what PodResourcesLister answers) ------------------------------------------

struct PodClaimDevice {
  std::string pool_name;
  std::string device_name;
  std::vector<std::string> cdi_device_ids;
};

// One DRA claim a container uses, as recorded from a successful NodePrepareResources.
struct PodDynamicResource {
  std::string claim_name;
  std::string claim_namespace;
  std::string claim_uid;  // to drop it again on NodeUnprepareResources
  std::string driver;
  std::vector<PodClaimDevice> devices;
};

struct PodContainerResources {
  std::map<std::string, std::vector<std::string>> devices;  // resource name -> device IDs
  std::vector<PodDynamicResource> dynamic_resources;
};

struct PodResourcesEntry {
  std::string namespace_;
  std::string name;
  std::map<std::string, PodContainerResources> containers;  // by container name
};

// Which pod (and containers) a kubelet call is admitting: allocations made with it appear in
// PodResourcesLister.List under that pod, as the kubelet records them after the call returns.
struct PodBinding {
  std::string namespace_;
  std::string name;
  std::vector<std::string> containers;  // one per container request (Allocate); DRA: the first
};

// Everything the simulator knows; WaitFor predicates see it under the simulator's lock.
struct KubeletState {
  std::map<std::string, ResourceState> resources;
  std::vector<RejectedRegistration> rejected;
  std::map<std::string, DraDriverState> dra_drivers;
  std::map<std::string, CsiDriverState> csi_drivers;  // registered now, by driver name
  std::map<std::string, PluginSocketState> plugin_sockets;  // keyed by socket path
  std::deque<PluginWatcherEvent> watcher_events;  // the newest max_watcher_events
  std::map<std::string, PodResourcesEntry> pods;  // "namespace/name" -> what List reports
  bool pod_resources_serving = false;
  std::uint64_t pod_resources_lists = 0;  // List calls answered
  std::uint64_t pod_resources_allocatable_calls = 0;  // GetAllocatableResources calls answered
  int restarts = 0;
  bool running = false;

  const ResourceState* FindResource(std::string_view resource) const;
  const DraDriverState* FindDraDriver(std::string_view driver) const;
};

// ---- DRA calls --------------------------------------------------------------------------

enum class DraVersion { kV1, kV1beta1 };
std::string_view ServiceName(DraVersion version);

struct DraClaim {
  std::string namespace_;
  std::string uid;
  std::string name;
};

struct DraPreparedDevice {
  std::vector<std::string> request_names;
  std::string pool_name;
  std::string device_name;
  std::vector<std::string> cdi_device_ids;
};

struct DraPrepareClaimResult {
  std::vector<DraPreparedDevice> devices;
  std::string error;
};

struct DraPrepareResult {
  RpcStatus status;  // a gRPC-level error: the kubelet ignores the whole response
  std::string service;  // the service called
  std::string endpoint;
  std::map<std::string, DraPrepareClaimResult> claims;  // by claim UID
  std::vector<std::string> missing_claims;  // requested UIDs without an entry (kubelet retries)
  bool ok() const { return status.ok(); }
};

struct DraUnprepareResult {
  RpcStatus status;
  std::string service;
  std::string endpoint;
  std::map<std::string, std::string> claims;  // claim UID -> error ("" = success)
  std::vector<std::string> missing_claims;
  bool ok() const { return status.ok(); }
};

// True for names the kubelet accepts as device-plugin resources (IsExtendedResourceName).
bool IsExtendedResourceName(std::string_view name);

class KubeletSim {
 public:
  explicit KubeletSim(KubeletSimOptions options);
  ~KubeletSim();  // Stop()
  KubeletSim(const KubeletSim&) = delete;
  KubeletSim& operator=(const KubeletSim&) = delete;

  // Creates device-plugins/ (0750) and plugins_registry/, removes stale device-plugins entries,
  // serves kubelet.sock and starts the plugin watcher. Throws std::runtime_error on failure.
  void Start();
  // Closes every connection and server and stops every thread. Idempotent.
  void Stop();
  // A kubelet restart: stop serving, drop every plugin connection, delete every non-directory
  // entry of device-plugins/ but the checkpoint (plugin sockets included), serve kubelet.sock
  // again and re-walk plugins_registry (each plugin socket there is registered afresh).
  void Restart();

  std::filesystem::path KubeletDir() const;
  std::filesystem::path DevicePluginDir() const;    // <kubelet>/device-plugins
  std::filesystem::path KubeletSocket() const;      // <kubelet>/device-plugins/kubelet.sock
  std::filesystem::path PluginsRegistryDir() const; // <kubelet>/plugins_registry
  std::filesystem::path PodResourcesSocket() const; // <kubelet>/pod-resources/kubelet.sock

  // ---- observation
  KubeletState State() const;  // a copy
  std::optional<ResourceState> Resource(const std::string& resource) const;
  std::vector<DeviceInfo> Devices(const std::string& resource) const;
  int Registrations(const std::string& resource) const;
  std::uint64_t ListAndWatchMessages(const std::string& resource) const;
  std::optional<DevicePluginOptions> LastOptions(const std::string& resource) const;
  bool Connected(const std::string& resource) const;
  std::optional<DraDriverState> DraDriver(const std::string& driver) const;
  // What the kubelet shows for the driver's `device` now ("" when it never heard of it).
  std::string DraDeviceHealthNow(const std::string& driver, const std::string& device) const;

  // Waits (condition variable, no polling) until `predicate` holds over the state; false on
  // timeout. The predicate runs under the simulator's lock: it must not call the simulator.
  bool WaitFor(const std::function<bool(const KubeletState&)>& predicate, std::chrono::milliseconds timeout) const;
  // Until the resource's latest device list satisfies `predicate`.
  bool WaitForDevices(const std::string& resource, const std::function<bool(const std::vector<DeviceInfo>&)>& predicate,
                      std::chrono::milliseconds timeout) const;
  // Until device `id` of `resource` reports `health` ("Healthy" / "Unhealthy").
  bool WaitForDeviceHealth(const std::string& resource, const std::string& id, const std::string& health,
                           std::chrono::milliseconds timeout) const;
  bool WaitForRegistrations(const std::string& resource, int count, std::chrono::milliseconds timeout) const;
  bool WaitForDraDriver(const std::string& driver, std::chrono::milliseconds timeout) const;
  // Until the kubelet shows `health` ("HEALTHY", …) for the driver's `device`: what its last
  // health message said, or "UNKNOWN" once that report is older than its timeout
  // (DraDeviceHealth::SeenAt; the wait wakes at that moment too).
  bool WaitForDraDeviceHealth(const std::string& driver, const std::string& device, const std::string& health,
                              std::chrono::milliseconds timeout) const;

  // ---- calls a kubelet makes to a device plugin (on its latest connection)
  // One AllocateRequest with one ContainerAllocateRequest per element.
  RpcResult<v1beta1::AllocateResponse> Allocate(const std::string& resource,
                                                const std::vector<std::vector<std::string>>& container_requests);
  // One container's preferred allocation.
  RpcResult<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(const std::string& resource,
                                                                         const std::vector<std::string>& available,
                                                                         const std::vector<std::string>& must_include,
                                                                         int size);
  RpcResult<v1beta1::PreStartContainerResponse> PreStartContainer(const std::string& resource,
                                                                  const std::vector<std::string>& device_ids);

  // ---- calls a kubelet makes to a DRA plugin
  // Through the service chosen at registration, on the latest (preferably connected) endpoint.
  DraPrepareResult NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims);
  DraUnprepareResult NodeUnprepareResources(const std::string& driver, const std::vector<DraClaim>& claims);
  // Forcing a version, whatever was negotiated.
  DraPrepareResult NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                        DraVersion version);
  DraUnprepareResult NodeUnprepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                            DraVersion version);

  // The same calls admitting a pod: on success the devices / prepared claims are recorded under
  // `pod` and show in PodResourcesLister.List. Allocate needs one container name per request.
  RpcResult<v1beta1::AllocateResponse> Allocate(const std::string& resource,
                                                const std::vector<std::vector<std::string>>& container_requests,
                                                const PodBinding& pod);
  DraPrepareResult NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                        const PodBinding& pod);

  // ---- pod resources
  // The pod is gone (deleted, or its containers ended): List no longer reports it. False if unknown.
  bool ForgetPod(const std::string& namespace_, const std::string& name);
  // Records devices for a container without calling any plugin (IDs are not checked): how a test
  // makes the kubelet report what our plugin never allocated, or malformed entries.
  void InjectPodDevices(const std::string& namespace_, const std::string& name, const std::string& container,
                        const std::string& resource, const std::vector<std::string>& ids);
  std::map<std::string, PodResourcesEntry> Pods() const;
  // Opens / closes the PodResourcesLister socket (a kubelet without it, then with it).
  void StartPodResources();
  void StopPodResources();

  // GetInfo on every registered plugin socket now (the kubelet's plugin monitor); two consecutive
  // failures deregister the plugin. Returns each socket's result.
  std::map<std::string, RpcStatus> ProbePluginSockets();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gns::sim
