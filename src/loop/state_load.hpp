#pragma once
// A module that starts from files of its state directory reads them on the BlockingPool, never
// on the loop: a slow disk or a large file must not stall the loop (every module, /healthz).
// Start() stays synchronous and returns at once; the module runs but is not ready ("loading
// ...") until its state is back, and nothing that depends on that state may run before: the
// module starts its subscriptions, servers and streams in `then`.

#include "loop/gate.hpp"
#include "loop/module.hpp"

#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace gns {

// Runs `load()` on the pool (blocking; paths in, values out: module state never travels there)
// and `then(result)` on the loop, unless `alive`'s gate closed meanwhile: a module stopped or
// destroyed during the load is never touched. `then` decides the module's health again; a
// `load` that throws (a bug: the readers return their errors) is reported as a failure.
template <typename Load, typename Then>
void LoadStateOffLoop(ModuleContext& context, Gate::Ticket alive, const std::string& what, Load load,
                      Then then) {
  using Result = std::invoke_result_t<Load>;
  context.SetHealth(ModuleHealth::kUnhealthy, "loading " + what);
  context.Pool().Run(std::move(load), [&context, alive = std::move(alive), what, then = std::move(then)](
                                          Result result, std::exception_ptr error) mutable {
    if (!alive) return;
    if (error) {
      context.ReportFailure("loading " + what + ": unexpected exception");
      return;
    }
    then(std::move(result));
  });
}

}  // namespace gns
