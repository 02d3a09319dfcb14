#pragma once
// The client side of the admin socket (<stateDir>/admin.sock, served by the gpu-health
// module): the `set-healthy --gpu UUID|all` subcommand.

#include <ostream>
#include <string>

namespace gns {

// Sends "set-healthy <gpu>" to the running supervisor, prints its answer (stdout on success,
// stderr otherwise) and returns the exit code: 0 ok, 1 refused, 2 usage, 3 no supervisor.
int RunSetHealthy(const std::string& state_dir, const std::string& gpu);

// Sends "reset-gpu <gpu>" to <stateDir>/reset.sock (the gpu-reset module) and prints each line
// as it arrives (the steps of the reset). Exit code: 0 when the reset completed and validated
// ("ok: …"), 1 when it failed or was refused, 2 usage, 3 no supervisor or connection lost.
int RunResetGpu(const std::string& state_dir, const std::string& gpu, std::ostream& out, std::ostream& err);

// One request line → one answer line (without the newline). False with `error` when the
// socket cannot be reached or answers nothing within `timeout_ms`.
bool AdminRequest(const std::string& socket_path, const std::string& line, std::string& answer, std::string& error,
                  int timeout_ms = 10000);

}  // namespace gns
