#pragma once
// The gkm-csi tests mount for real. Before main() (no thread yet, so every thread the tests
// start lives in it) the executable moves into a mount namespace of its own, with / made
// private: nothing it mounts reaches the host, and it all goes when the process ends. Where
// that is not allowed, MountsSkipReason() says why and the mounting tests skip, saying so.

#include <string>

namespace gns::gkm_csi::test {

// Empty when the private mount namespace is in place.
const std::string& MountsSkipReason();

}  // namespace gns::gkm_csi::test
