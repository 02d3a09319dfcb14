// Keeping a DRA driver's ResourceSlice true.
#include "dra_plugin/slice_publisher.hpp"

#include "loop/json_fields.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"

#include <algorithm>

namespace gns::dra {

namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kRetryInitial{500};
constexpr milliseconds kRetryMax{30000};

}  // namespace

SlicePublisher::SlicePublisher(ModuleContext& context, Options options, Counters counters, Hooks hooks)
    : context_(context),
      options_(std::move(options)),
      counters_(counters),
      hooks_(std::move(hooks)),
      slice_name_(dra::SliceName(options_.node_name, options_.driver_name)),
      retry_delay_(kRetryInitial),
      retry_timer_(context.GetLoop().Io()),
      resync_timer_(context.GetLoop().Io()) {}

SlicePublisher::~SlicePublisher() { lifetime_.Close(); }

std::string SlicePublisher::Collection() const {
  return kube::ResourcePath::Grouped("resource.k8s.io", std::string(ApiVersionOnly(options_.api_version)),
                                     "resourceslices")
      .Collection();
}

json SlicePublisher::Desired(int64_t generation) const {
  SliceSpec spec;
  spec.driver_name = options_.driver_name;
  spec.node_name = options_.node_name;
  spec.node_uid = node_uid_;
  spec.generation = std::max<int64_t>(generation, 1);
  spec.api_version = options_.api_version;
  spec.devices = hooks_.devices();
  return BuildSlice(spec);
}

void SlicePublisher::Start(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::InformerRegistry> informers) {
  stopping_ = false;
  client_ = std::move(client);
  informers_ = std::move(informers);
  // Keep the ResourceSlice true: the kubelet deletes a node's slices when it starts.
  const kube::InformerSpec spec{Collection(), "",
                                "spec.nodeName=" + options_.node_name + ",spec.driver=" + options_.driver_name};
  informer_key_ = spec.Key();
  sub_ = context_.GetBus().Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& event) {
    if (event.informer_key != informer_key_ || !event.object) return;
    if (JsonStringAt(*event.object, "/metadata/name") != slice_name_) return;
    if (event.type == kube::ResourceEvent::Type::kDeleted) {
      context_.Log().warn("ResourceSlice {} was deleted (a kubelet start wipes the node's slices): recreating it",
                          slice_name_);
      Publish();
    } else if (!node_uid_.empty() && SliceNeedsUpdate(*event.object, Desired(0))) {
      Publish();
    }
  });
  informer_ = informers_->Acquire(spec);
  Publish();
  ScheduleResync();
}

void SlicePublisher::Stop() {
  stopping_ = true;
  retry_timer_.cancel();
  resync_timer_.cancel();
  sub_.Reset();
  informer_.reset();
}

void SlicePublisher::Publish() {
  if (stopping_ || !client_) return;
  if (busy_) {
    again_ = true;
    return;
  }
  busy_ = true;
  retry_timer_.cancel();
  if (!node_uid_.empty()) {
    PublishWithNode();
    return;
  }
  // The slice is owned by the Node (garbage-collected with it): its UID first.
  client_->Get(kube::ResourcePath::Core("nodes").Object(options_.node_name),
               lifetime_.Guard([this](kube::Result result) {
                 if (stopping_) return;
                 if (!result.Ok()) {
                   Done(false, "cannot read Node " + options_.node_name + ": " + result.error);
                   return;
                 }
                 node_uid_ = JsonStringAt(result.object, "/metadata/uid");
                 PublishWithNode();
               }));
}

void SlicePublisher::PublishWithNode() {
  const std::string name = slice_name_;
  const std::string path = Collection() + "/" + name;
  client_->Get(path, lifetime_.Guard([this, name, path](kube::Result current) {
    if (stopping_) return;
    if (current.http_status == 404) {
      // A new slice starts a new pool generation, above any we wrote before.
      const int64_t generation = generation_ + 1;
      client_->Create(Collection(), Desired(generation), lifetime_.Guard([this, name, generation](kube::Result created) {
                        if (stopping_) return;
                        if (!created.Ok()) {
                          Done(false, "cannot create ResourceSlice " + name + ": " + created.error);
                          return;
                        }
                        generation_ = generation;
                        counters_.created->Inc();
                        context_.Log().info("created ResourceSlice {} (pool generation {}, {})", name, generation,
                                            hooks_.note());
                        Done(true, {});
                      }));
      return;
    }
    if (!current.Ok()) {
      Done(false, "cannot read ResourceSlice " + name + ": " + current.error);
      return;
    }
    const json gen_ptr = current.object.value(json::json_pointer("/spec/pool/generation"), json(0));
    const int64_t current_generation = gen_ptr.is_number_integer() ? gen_ptr.get<int64_t>() : 0;
    if (!SliceNeedsUpdate(current.object, Desired(current_generation))) {
      generation_ = current_generation;
      Done(true, {});
      return;
    }
    const int64_t generation = std::max(current_generation, generation_) + 1;
    json desired = Desired(generation);
    desired["metadata"]["resourceVersion"] = JsonStringAt(current.object, "/metadata/resourceVersion");
    client_->Update(path, desired, lifetime_.Guard([this, name, generation](kube::Result updated) {
      if (stopping_) return;
      if (!updated.Ok()) {
        Done(false, "cannot update ResourceSlice " + name + ": " + updated.error);
        return;
      }
      generation_ = generation;
      counters_.updated->Inc();
      context_.Log().info("updated ResourceSlice {} (pool generation {}, {})", name, generation, hooks_.note());
      Done(true, {});
    }));
  }));
}

void SlicePublisher::Done(bool ok, const std::string& error) {
  busy_ = false;
  if (ok) {
    ++publishes_;
    retry_delay_ = kRetryInitial;
  } else {
    counters_.errors->Inc();
    context_.Log().warn("{}; retrying in {} ms", error, retry_delay_.count());
    hooks_.on_error(error);
    if (!again_) ScheduleRetry();
  }
  if (again_) {
    again_ = false;
    Publish();
  }
  hooks_.on_attempt();
}

void SlicePublisher::ScheduleRetry() {
  retry_timer_.expires_after(retry_delay_);
  retry_delay_ = std::min(retry_delay_ * 2, kRetryMax);
  retry_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec) return;
    Publish();
  }));
}

void SlicePublisher::ScheduleResync() {
  resync_timer_.expires_after(options_.resync);
  resync_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    Publish();
    ScheduleResync();
  }));
}

}  // namespace gns::dra
