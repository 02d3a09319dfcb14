#pragma once
// The client side of the admin socket (<stateDir>/admin.sock, served by the gpu-health
// module): the `set-healthy --gpu UUID|all` subcommand.

#include <string>

namespace gns {

// Sends "set-healthy <gpu>" to the running supervisor, prints its answer (stdout on success,
// stderr otherwise) and returns the exit code: 0 ok, 1 refused, 2 usage, 3 no supervisor.
int RunSetHealthy(const std::string& state_dir, const std::string& gpu);

// One request line → one answer line (without the newline). False with `error` when the
// socket cannot be reached or answers nothing within `timeout_ms`.
bool AdminRequest(const std::string& socket_path, const std::string& line, std::string& answer, std::string& error,
                  int timeout_ms = 10000);

}  // namespace gns
