// A private mount namespace for the whole test executable, made before main(): see
// mount_namespace.hpp.
#include "mount_namespace.hpp"

#include <sched.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>

namespace gns::gkm_csi::test {

namespace {

std::string EnterPrivateMountNamespace() {
  if (::unshare(CLONE_NEWNS) != 0) {
    return std::string("unshare(CLONE_NEWNS) failed: ") + std::strerror(errno) +
           " (needs CAP_SYS_ADMIN; run as root or under `unshare -Urm`)";
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return std::string("making / private in the new mount namespace failed: ") + std::strerror(errno);
  }
  return {};
}

const std::string& Reason() {
  static const std::string reason = EnterPrivateMountNamespace();
  return reason;
}

// Before main(): the pool and gRPC threads start later, inside the namespace.
const bool kEntered = !Reason().empty() || true;

}  // namespace

const std::string& MountsSkipReason() {
  (void)kEntered;
  return Reason();
}

}  // namespace gns::gkm_csi::test
