// The gkm-csi module: recovery, the volume book, publish and unpublish. See gkm_csi_module.hpp.
#include "modules/gkm_csi/gkm_csi_module.hpp"

#include "dra_plugin/registration_server.hpp"
#include "loop/exception_text.hpp"
#include "modules/gkm_csi/csi_service.hpp"
#include "modules/gkm_csi/volume_ops.hpp"

#include <ctime>

namespace gns::gkm_csi {

namespace {

std::string Now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string CodeName(int code) {
  switch (code) {
    case 0: return "OK";
    case kInvalidArgument: return "INVALID_ARGUMENT";
    case kNotFound: return "NOT_FOUND";
    case kAlreadyExists: return "ALREADY_EXISTS";
    case kFailedPrecondition: return "FAILED_PRECONDITION";
    case kAborted: return "ABORTED";
    case kInternal: return "INTERNAL";
    case kUnavailable: return "UNAVAILABLE";
    default: return std::to_string(code);
  }
}

}  // namespace

GkmCsiModule::Config GkmCsiModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config c;
  c.plugin_dir = section.String("pluginDir", site.paths.kubelet_dir + "/plugins/" + std::string(kDriverName));
  c.registration_dir = section.String("registrationDir", site.paths.kubelet_dir + "/plugins_registry");
  for (const auto& [key, value] : {std::pair{"pluginDir", c.plugin_dir}, {"registrationDir", c.registration_dir}}) {
    if (value.empty() || value.front() != '/') section.Fail(key, "must be an absolute path");
  }
  c.register_plugin = section.Bool("register", true);
  return c;
}

GkmCsiModule::GkmCsiModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config), node_(context.Site().node_name) {}

GkmCsiModule::~GkmCsiModule() { lifetime_.Close(); }

void GkmCsiModule::Start() {
  if (node_.empty()) throw std::runtime_error("gkm-csi needs the node name (site nodeName): it is the CSI node id");
  UpdateGauge();
  // The agent publishes its caches (retained) from its start on: the first message also says
  // where the usage records are, so recovery starts there.
  states_sub_ = context_.GetBus().Subscribe<gkm::CacheStates>(
      [this](const gkm::CacheStates& states) { OnStates(states); });
}

void GkmCsiModule::OnStates(const gkm::CacheStates& states) {
  states_ = states;
  if (recovering_ || serving_) return;
  recovering_ = true;
  // After a restart (or kill -9): the volumes we had are those whose usage record names a
  // target that is still a mount point. Before serving, so a retried publish or an unpublish
  // of such a volume finds it.
  auto recover = [usage_root = states.usage_root] { return RecoverVolumes(usage_root); };
  context_.Pool().Run(std::move(recover), lifetime_.Guard([this](Recovery recovery, std::exception_ptr error) {
    recovering_ = false;
    if (error) {
      context_.ReportFailure("recovering CSI volumes: " + DescribeException(error));
      return;
    }
    for (const auto& e : recovery.errors) context_.Log().warn("recovery: {}", e);
    for (const auto& d : recovery.dropped) context_.Log().info("recovery: dropped {}", d);
    for (auto& v : recovery.volumes) {
      Volume volume;
      volume.key = v.key;
      volume.usage_dir = states_->usage_root + "/" + v.key;
      volume.record = std::move(v.record);
      volume.phase = Volume::Phase::kPublished;
      context_.Log().info("recovery: volume {} of {} mounted at {}", volume.record.volume_id, volume.key,
                          volume.record.target_path);
      volumes_[volume.record.volume_id] = std::move(volume);
    }
    UpdateGauge();
    try {
      Serve();
    } catch (const std::exception& e) {
      context_.ReportFailure(e.what());
    }
  }));
}

void GkmCsiModule::Serve() {
  CsiService::Backend backend;
  backend.ready = [this] { return serving_ && states_ && states_->listed; };
  backend.publish = [this](PublishRequest r, CsiService::Reply reply) { Publish(std::move(r), std::move(reply)); };
  backend.unpublish = [this](std::string id, std::string target, CsiService::Reply reply) {
    Unpublish(std::move(id), std::move(target), std::move(reply));
  };
  backend.stats = [this](std::string id, std::string path, CsiService::Backend::StatsReply reply) {
    Stats(std::move(id), std::move(path), std::move(reply));
  };
  service_ = std::make_unique<CsiService>(
      context_.GetLoop(), CsiService::Info{std::string(kDriverName), GNS_VERSION, node_}, std::move(backend));
  service_->Start(SocketPath());
  serving_ = true;
  context_.Log().info("CSI node plugin {} serving on {}", kDriverName, SocketPath());
  if (!config_.register_plugin) return;
  dra::RegistrationServer::Info info;
  info.type = "CSIPlugin";
  info.driver_name = std::string(kDriverName);
  info.endpoint = SocketPath();
  info.supported_versions = {"1.0.0"};  // the kubelet's CSI handler wants a 1.x version
  registration_ = std::make_unique<dra::RegistrationServer>(
      context_.GetLoop(), std::move(info), lifetime_.Guard([this](bool registered, const std::string& error) {
        if (registered) {
          context_.Log().info("registered with the kubelet as CSI driver {}", kDriverName);
        } else {
          context_.Log().warn("the kubelet refused CSI driver {}: {}", kDriverName, error);
        }
      }));
  registration_->Start(config_.registration_dir + "/" + std::string(kDriverName) + "-reg.sock");
}

void GkmCsiModule::Publish(PublishRequest request, Reply reply_to) {
  auto reply = [this, reply_to = std::move(reply_to)](std::optional<CsiError> error) {
    Count("NodePublishVolume", error);
    reply_to(std::move(error));
  };
  auto parsed = ParsePublish(request);
  if (!parsed.wish) return reply(parsed.error);
  const VolumeWish& wish = *parsed.wish;
  const std::string& id = request.volume_id;
  const std::string& target = request.target_path;
  if (auto it = volumes_.find(id); it != volumes_.end()) {
    const Volume& v = it->second;
    if (v.phase != Volume::Phase::kPublished) {
      return reply(CsiError{kAborted, "volume " + id + ": an operation on it is still in progress"});
    }
    if (v.record.target_path == target && v.key == wish.key && v.record.read_only == wish.read_only) {
      return reply(std::nullopt);  // published already, as asked: the same answer again
    }
    return reply(CsiError{kAlreadyExists, "volume " + id + " is published at " + v.record.target_path + " from " +
                                              v.key + (v.record.read_only ? " read-only" : " read-write") +
                                              "; asked: " + target + " from " + wish.key +
                                              (wish.read_only ? " read-only" : " read-write")});
  }
  for (const auto& [other_id, v] : volumes_) {
    if (v.record.target_path == target) {
      return reply(CsiError{kAlreadyExists, "target " + target + " holds volume " + other_id + " (" + v.key +
                                                "), not " + id + " (" + wish.key + ")"});
    }
  }
  if (auto error = CheckCache(wish, states_ ? &*states_ : nullptr, node_)) return reply(error);
  const gkm::CacheView& view = states_->caches.at(wish.key);
  Volume volume;
  volume.key = wish.key;
  volume.usage_dir = view.usage_dir;
  volume.record.pod_name = wish.pod_name;
  volume.record.pod_namespace = wish.pod_namespace;
  volume.record.pod_uid = wish.pod_uid;
  volume.record.volume_id = id;
  volume.record.target_path = target;
  volume.record.start_time = Now();
  volume.record.volume_size = view.size_bytes;
  volume.record.read_only = wish.read_only;
  PublishJob job{view.directory, view.usage_dir, target, wish.read_only, volume.record};
  context_.Log().info("volume {}: mounting {} ({}) at {}{}{}", id, wish.Describe(), view.directory, target,
                      wish.read_only ? " read-only" : " read-write",
                      wish.pod_name.empty() ? "" : " for pod " + wish.pod_namespace + "/" + wish.pod_name);
  volumes_[id] = std::move(volume);
  UpdateGauge();
  auto work = [job = std::move(job)] { return PublishVolume(job); };
  context_.Pool().Run(std::move(work),
                      lifetime_.Guard([this, id, reply](std::optional<CsiError> error, std::exception_ptr failure) {
                        if (failure) error = CsiError{kInternal, "volume " + id + ": " + DescribeException(failure)};
                        auto it = volumes_.find(id);
                        if (error) {
                          context_.Log().warn("volume {}: not published: {}", id, error->message);
                          if (it != volumes_.end()) volumes_.erase(it);
                        } else if (it != volumes_.end()) {
                          it->second.phase = Volume::Phase::kPublished;
                        }
                        UpdateGauge();
                        reply(std::move(error));
                      }));
}

void GkmCsiModule::Unpublish(std::string volume_id, std::string target, Reply reply_to) {
  auto reply = [this, reply_to = std::move(reply_to)](std::optional<CsiError> error) {
    Count("NodeUnpublishVolume", error);
    reply_to(std::move(error));
  };
  if (volume_id.empty()) return reply(CsiError{kInvalidArgument, "volume_id is required"});
  if (target.empty() || target.front() != '/') {
    return reply(CsiError{kInvalidArgument, "target_path must be an absolute path, got \"" + target + "\""});
  }
  UnpublishJob job{target, {}, volume_id};
  auto it = volumes_.find(volume_id);
  if (it != volumes_.end()) {
    if (it->second.phase != Volume::Phase::kPublished) {
      return reply(CsiError{kAborted, "volume " + volume_id + ": an operation on it is still in progress"});
    }
    if (it->second.record.target_path == target) {
      job.usage_dir = it->second.usage_dir;
      it->second.phase = Volume::Phase::kUnpublishing;
    }
  }
  // Unknown here (never published, or unpublished already): whatever is mounted at the target the
  // kubelet names for this volume goes, and the answer is OK (the spec's idempotency).
  context_.Log().info("volume {}: unmounting {}", volume_id, target);
  auto work = [job = std::move(job)] { return UnpublishVolume(job); };
  context_.Pool().Run(std::move(work), lifetime_.Guard([this, volume_id, target, reply](std::optional<CsiError> error,
                                                                                        std::exception_ptr failure) {
    if (failure) error = CsiError{kInternal, "volume " + volume_id + ": " + DescribeException(failure)};
    auto it = volumes_.find(volume_id);
    if (it != volumes_.end() && it->second.record.target_path == target &&
        it->second.phase == Volume::Phase::kUnpublishing) {
      if (error) {
        it->second.phase = Volume::Phase::kPublished;  // still there: the kubelet retries
      } else {
        volumes_.erase(it);
      }
    }
    if (error) context_.Log().warn("volume {}: not unpublished: {}", volume_id, error->message);
    UpdateGauge();
    reply(std::move(error));
  }));
}

void GkmCsiModule::Stats(std::string volume_id, std::string path,
                         std::function<void(std::optional<CsiError>, VolumeStats)> reply_to) {
  auto reply = [this, reply_to = std::move(reply_to)](std::optional<CsiError> error, VolumeStats stats) {
    Count("NodeGetVolumeStats", error);
    reply_to(std::move(error), stats);
  };
  if (volume_id.empty()) return reply(CsiError{kInvalidArgument, "volume_id is required"}, {});
  if (path.empty()) return reply(CsiError{kInvalidArgument, "volume_path is required"}, {});
  // The spec: NOT_FOUND for a volume that is not there, or not at that path.
  auto it = volumes_.find(volume_id);
  if (it == volumes_.end() || it->second.phase != Volume::Phase::kPublished) {
    return reply(CsiError{kNotFound, "volume " + volume_id + " is not published on node " + node_}, {});
  }
  if (it->second.record.target_path != path) {
    return reply(CsiError{kNotFound, "volume " + volume_id + " is published at " + it->second.record.target_path +
                                         ", not at " + path},
                 {});
  }
  // A walk of the cache's tree: on the pool.
  context_.Pool().Run(
      [path] {
        std::pair<std::optional<CsiError>, VolumeStats> out;
        out.first = MeasureVolume(path, out.second);
        return out;
      },
      lifetime_.Guard([volume_id, reply](std::pair<std::optional<CsiError>, VolumeStats> out, std::exception_ptr failure) {
        if (failure) out.first = CsiError{kInternal, "volume " + volume_id + ": " + DescribeException(failure)};
        reply(std::move(out.first), out.second);
      }));
}

void GkmCsiModule::Count(std::string_view method, const std::optional<CsiError>& error) {
  context_.Metrics()
      .Counter("gpu_node_supervisor_gkm_csi_calls_total", "CSI node calls answered, by method and gRPC code",
               {{"method", std::string(method)}, {"code", CodeName(error ? error->code : 0)}})
      .Inc();
}

void GkmCsiModule::UpdateGauge() {
  int published = 0;
  for (const auto& [id, v] : volumes_) published += v.phase == Volume::Phase::kPublished;
  context_.Metrics()
      .Gauge("gpu_node_supervisor_gkm_csi_volumes", "Kernel-cache volumes mounted into pods on this node")
      .Set(published);
}

void GkmCsiModule::Stop(std::function<void()> done) {
  lifetime_.Renew();
  states_sub_ = {};
  serving_ = false;
  // Mounts stay: the pods keep their caches while we are down, and the next start finds them.
  auto registration = std::shared_ptr<dra::RegistrationServer>(std::move(registration_));
  auto service = std::shared_ptr<CsiService>(std::move(service_));
  auto stop_service = [this, service, done = std::move(done)]() mutable {
    if (!service) return done();
    service->Shutdown(context_.Pool(), [service, done = std::move(done)] { done(); });
  };
  if (!registration) return stop_service();
  registration->Shutdown(context_.Pool(), [registration, stop_service = std::move(stop_service)]() mutable {
    stop_service();
  });
}

}  // namespace gns::gkm_csi
