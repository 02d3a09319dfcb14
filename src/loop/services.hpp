#pragma once
// The few request/response interfaces one module offers others (the Kubernetes client, the
// GPU inventory), looked up by type. Modules otherwise meet only on the bus. A provider keeps
// its service object alive (shared_ptr) so a consumer never holds a dangling reference while
// the provider restarts; the object itself reports when it is not usable.

#include <memory>
#include <typeindex>
#include <unordered_map>

namespace gns {

class Services {
 public:
  template <typename T>
  void Provide(std::shared_ptr<T> service) {
    services_[std::type_index(typeid(T))] = std::move(service);
  }

  template <typename T>
  void Withdraw() {
    services_.erase(std::type_index(typeid(T)));
  }

  // nullptr when nobody provides T (yet).
  template <typename T>
  std::shared_ptr<T> Find() const {
    const auto it = services_.find(std::type_index(typeid(T)));
    return it == services_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

 private:
  std::unordered_map<std::type_index, std::shared_ptr<void>> services_;
};

}  // namespace gns
