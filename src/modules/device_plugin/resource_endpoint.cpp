// One resource's server and kubelet registration.
#include "modules/device_plugin/resource_endpoint.hpp"

#include <unistd.h>

namespace gns::device_plugin {

ResourceEndpoint::ResourceEndpoint(ModuleContext& context, Settings settings, Hooks hooks)
    : context_(context),
      settings_(std::move(settings)),
      hooks_(std::move(hooks)),
      socket_path_(settings_.plugin_dir + "/" + settings_.socket_name),
      kubelet_socket_(settings_.plugin_dir + "/kubelet.sock"),
      register_backoff_(settings_.register_backoff),
      register_timer_(context.GetLoop().Io()) {
  registrations_total_ = &context_.Metrics().Counter("gpu_node_supervisor_device_plugin_registrations_total",
                                                     "Successful registrations with the kubelet",
                                                     {{"resource", settings_.resource}});
}

ResourceEndpoint::~ResourceEndpoint() { *alive_ = false; }

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
  raw->Shutdown(context_.Pool(), [this, alive = alive_, old = std::shared_ptr<PluginServer>(std::move(old))] {
    if (!*alive || stopping_) return;
    restarting_ = false;
    try {
      StartServing();
    } catch (const std::exception& e) {
      context_.ReportFailure("cannot serve " + settings_.resource + " again: " + e.what());
    }
  });
}

void ResourceEndpoint::Register() {
  if (registering_ || !serving_ || stopping_) return;
  registering_ = true;
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(settings_.socket_name);
  request.set_resource_name(settings_.resource);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  RegisterWithKubelet(
      context_.GetLoop(), kubelet_socket_, request, settings_.register_timeout,
      [this, alive = alive_](const grpc::Status& status) {
        if (!*alive) return;
        registering_ = false;
        if (stopping_ || !serving_) return;
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
        context_.Log().warn("registration of {} failed ({}: {}); retrying in {} ms", settings_.resource,
                            static_cast<int>(status.error_code()), status.error_message(), delay.count());
        SetProblem("registration of " + settings_.resource + " failed: " + status.error_message());
        register_timer_.expires_after(delay);
        register_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
          if (ec || !*alive) return;
          if (::access(kubelet_socket_.c_str(), F_OK) == 0) Register();
        });
      });
}

void ResourceEndpoint::OnKubeletSocketCreated() {
  register_backoff_.Reset();
  register_timer_.cancel();
  Register();  // no-op while restarting: StartServing registers when done
}

void ResourceEndpoint::OnKubeletSocketDeleted() {
  registered_ = false;
  SetProblem("kubelet.sock removed; waiting for the kubelet");
}

void ResourceEndpoint::OnOurSocketDeleted() {
  // The kubelet's start-up clean-up removes every socket there, ours included.
  if (serving_) RestartServing("our socket " + socket_path_ + " was removed");
}

void ResourceEndpoint::OnOverflow() {
  if (::access(socket_path_.c_str(), F_OK) != 0) RestartServing("inotify overflow and our socket is gone");
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
  server_->Shutdown(context_.Pool(), [this, alive = alive_, done = std::move(done)] {
    if (*alive) server_.reset();  // the socket is already gone: the kubelet cannot dial a dead one
    done();
  });
}

}  // namespace gns::device_plugin
