// One resource's server and kubelet registration.
#include "modules/device_plugin/resource_endpoint.hpp"

#include "modules/device_plugin/mps.hpp"

#include "loop/grpc_status_text.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gns::device_plugin {

ResourceEndpoint::ResourceEndpoint(ModuleContext& context, Settings settings, Hooks hooks)
    : context_(context),
      settings_(std::move(settings)),
      hooks_(std::move(hooks)),
      socket_path_(settings_.plugin_dir + "/" + settings_.socket_name),
      kubelet_socket_(settings_.plugin_dir + "/kubelet.sock"),
      register_backoff_(settings_.register_backoff),
      listen_backoff_(BackoffPolicy{std::chrono::milliseconds(1), settings_.register_backoff.max, 2.0, 0.0}),
      register_timer_(context.GetLoop().Io()) {
  registrations_total_ = &context_.Metrics().Counter("gpu_node_supervisor_device_plugin_registrations_total",
                                                     "Successful registrations with the kubelet",
                                                     {{"resource", settings_.resource}});
}

ResourceEndpoint::~ResourceEndpoint() { lifetime_.Close(); }

void ResourceEndpoint::Start() { StartServing(); }

void ResourceEndpoint::SetProblem(std::string problem) {
  problem_ = std::move(problem);
  if (hooks_.state_changed) hooks_.state_changed();
}

void ResourceEndpoint::StartServing() {
  PluginServer::Handlers handlers;
  handlers.options.set_pre_start_required(false);
  handlers.options.set_get_preferred_allocation_available(true);
  handlers.current_list = hooks_.current_list;
  handlers.allocate = hooks_.allocate;
  handlers.preferred = hooks_.preferred;
  server_ = std::make_unique<PluginServer>(context_.GetLoop(), std::move(handlers));
  server_->Start(socket_path_);
  struct stat st {};
  socket_dev_ = 0;
  socket_ino_ = 0;
  if (::lstat(socket_path_.c_str(), &st) == 0) {
    socket_dev_ = st.st_dev;
    socket_ino_ = st.st_ino;
  }
  serving_ = true;
  last_sent_.clear();
  context_.Log().info("serving {} on {}", settings_.resource, socket_path_);
  if (::access(kubelet_socket_.c_str(), F_OK) == 0) {
    SetProblem("registering");
    Register();
  } else {
    context_.Log().info("waiting for {} before registering {}", kubelet_socket_, settings_.resource);
    SetProblem("kubelet.sock not present; not registered");
  }
}

void ResourceEndpoint::RestartServing(const std::string& why) {
  if (restarting_ || stopping_) return;
  context_.Log().warn("{}: serving {} again", why, settings_.resource);
  restarting_ = true;
  serving_ = false;
  registered_ = false;
  register_timer_.cancel();
  SetProblem(why);
  auto old = std::move(server_);
  auto* raw = old.get();
  raw->Shutdown(context_.Pool(), lifetime_.Guard([this, old = std::shared_ptr<PluginServer>(std::move(old))] {
    if (stopping_) return;
    restarting_ = false;
    try {
      StartServing();
    } catch (const std::exception& e) {
      context_.ReportFailure("cannot serve " + settings_.resource + " again: " + e.what());
    }
  }));
}

void ResourceEndpoint::Register() {
  if (registering_ || !serving_ || stopping_) return;
  // Dial only a kubelet that listens. kubelet.sock appears at the kubelet's bind(), a moment
  // before its listen(): a gRPC dial in between is refused and gRPC then waits out its
  // reconnect backoff (a second) before the next try. connect() tells at once.
  const int err = ProbeUnixListener(kubelet_socket_);
  if (err != 0) {
    WaitForListener(err);
    return;
  }
  listen_backoff_.Reset();
  registering_ = true;
  const uint64_t generation = kubelet_generation_;
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(settings_.socket_name);
  request.set_resource_name(settings_.resource);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  server_->Register(
      kubelet_socket_, request, settings_.register_timeout,
      [this, alive = lifetime_.Watch(), generation](const grpc::Status& status) {
        if (!alive) return;
        registering_ = false;
        if (stopping_ || !serving_) return;
        if (generation != kubelet_generation_) {
          // kubelet.sock was created again while this call went to the kubelet before: register
          // with the one that listens now, at once (not after a backoff).
          context_.Log().info("kubelet.sock was replaced during the registration of {} ({}): registering again",
                              settings_.resource, status.ok() ? "it succeeded" : status.error_message());
          Register();
          return;
        }
        if (status.ok()) {
          registered_ = true;
          ++registrations_;
          registrations_total_->Inc();
          register_backoff_.Reset();
          context_.Log().info("registered {} with the kubelet", settings_.resource);
          SetProblem({});
          return;
        }
        const auto delay = register_backoff_.Next();
        const std::string why = DescribeGrpcStatus(status);
        context_.Log().warn("registration of {} failed ({}); retrying in {} ms", settings_.resource, why,
                            delay.count());
        SetProblem("registration of " + settings_.resource + " failed: " + why);
        register_timer_.expires_after(delay);
        register_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
          if (ec || !alive) return;
          if (::access(kubelet_socket_.c_str(), F_OK) == 0) Register();
        });
      });
}

void ResourceEndpoint::WaitForListener(int err) {
  if (err == ENOENT) {
    // Gone again: its next creation registers.
    SetProblem("kubelet.sock not present; not registered");
    return;
  }
  // Bound but not listening yet (the kubelet between bind and listen: microseconds to
  // milliseconds), or a dead kubelet's socket left behind: look again shortly, then less and
  // less often, up to the registration backoff's longest delay. No timer runs once registered.
  const std::string problem = "kubelet.sock does not accept connections yet (" + std::string(std::strerror(err)) +
                              "); not registered";
  if (problem_ != problem) {
    context_.Log().info("{} does not accept connections yet ({}): registering {} once it listens", kubelet_socket_,
                        std::strerror(err), settings_.resource);
    SetProblem(problem);
  }
  register_timer_.cancel();
  register_timer_.expires_after(listen_backoff_.Next());
  register_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec) return;
    Register();
  }));
}

void ResourceEndpoint::OnKubeletSocketCreated() {
  ++kubelet_generation_;
  register_backoff_.Reset();
  listen_backoff_.Reset();
  register_timer_.cancel();
  Register();  // no-op while restarting: StartServing registers when done
}

void ResourceEndpoint::OnKubeletSocketDeleted() {
  registered_ = false;
  register_timer_.cancel();  // its creation registers
  SetProblem("kubelet.sock removed; waiting for the kubelet");
}

bool ResourceEndpoint::OurSocketPresent() const {
  struct stat st {};
  return socket_ino_ != 0 && ::lstat(socket_path_.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
         st.st_ino == socket_ino_;
}

void ResourceEndpoint::OnOurSocketDeleted() {
  // The kubelet's start-up clean-up removes every socket there, ours included. The event may
  // also be of a file we removed ourselves (a killed run's stale socket, replaced as we started
  // serving): only a socket we serve that is gone from the path counts.
  if (serving_ && !OurSocketPresent()) RestartServing("our socket " + socket_path_ + " was removed");
}

void ResourceEndpoint::OnOverflow() {
  if (serving_ && !OurSocketPresent()) RestartServing("inotify overflow and our socket is gone");
  else if (::access(kubelet_socket_.c_str(), F_OK) == 0) Register();
}

void ResourceEndpoint::Refresh() {
  if (!server_ || !serving_) return;
  const auto list = hooks_.current_list();
  std::string serialized = list.SerializeAsString();
  if (serialized == last_sent_) return;
  last_sent_ = std::move(serialized);
  server_->Broadcast(list);
}

void ResourceEndpoint::Stop(std::function<void()> done) {
  stopping_ = true;
  register_timer_.cancel();
  if (!server_) {
    done();
    return;
  }
  serving_ = false;
  server_->Shutdown(context_.Pool(), [this, alive = lifetime_.Watch(), done = std::move(done)] {
    if (alive) server_.reset();  // the socket is already gone: the kubelet cannot dial a dead one
    done();
  });
}

}  // namespace gns::device_plugin
