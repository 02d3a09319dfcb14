#pragma once
// The few request/response interfaces one module offers others (the Kubernetes client, the
// GPU inventory), looked up by type. Modules otherwise meet only on the bus. A provider keeps
// its service object alive (shared_ptr) so a consumer never holds a dangling reference while
// the provider restarts; the object itself reports when it is not usable.
//
// Each module's context holds a view of the process's Services that names the module (its
// holder): Provide and Withdraw act on the shared set, and Find hands out the holder's own view
// of a service whose provider gave one (`view_for`: the kube module's client and informers,
// whose requests then name the module that makes them). Without a view, or found from the
// shared set itself (outside any module), it is the service object.

#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>

namespace gns {

class Services {
 public:
  template <typename T>
  using ViewFor = std::function<std::shared_ptr<T>(const std::string& holder)>;

  Services() = default;
  // The view of `shared` that `holder` (a module's name) finds services through.
  Services(Services& shared, std::string holder) : shared_(&shared), holder_(std::move(holder)) {}
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  // `view_for` (optional) makes the object a holder finds; it is asked on every Find of a
  // holder, so it should hand the same view out again rather than make a new one each time.
  template <typename T>
  void Provide(std::shared_ptr<T> service, ViewFor<T> view_for = {}) {
    if (shared_) return shared_->Provide<T>(std::move(service), std::move(view_for));
    Entry entry{std::move(service), {}};
    if (view_for) {
      entry.view_for = [view_for = std::move(view_for)](const std::string& holder) -> std::shared_ptr<void> {
        return view_for(holder);
      };
    }
    services_[std::type_index(typeid(T))] = std::move(entry);
  }

  template <typename T>
  void Withdraw() {
    if (shared_) return shared_->Withdraw<T>();
    services_.erase(std::type_index(typeid(T)));
  }

  // nullptr when nobody provides T (yet).
  template <typename T>
  std::shared_ptr<T> Find() const {
    if (shared_) return shared_->FindFor<T>(holder_);
    return FindFor<T>({});
  }

  // The holder this view names ("" for the shared set).
  const std::string& Holder() const { return holder_; }

 private:
  struct Entry {
    std::shared_ptr<void> object;
    std::function<std::shared_ptr<void>(const std::string&)> view_for;
  };

  template <typename T>
  std::shared_ptr<T> FindFor(const std::string& holder) const {
    const auto it = services_.find(std::type_index(typeid(T)));
    if (it == services_.end()) return nullptr;
    if (!holder.empty() && it->second.view_for) return std::static_pointer_cast<T>(it->second.view_for(holder));
    return std::static_pointer_cast<T>(it->second.object);
  }

  Services* shared_ = nullptr;
  std::string holder_;
  std::unordered_map<std::type_index, Entry> services_;
};

}  // namespace gns
