// The client's verbs as awaitables (see client.hpp): each starts the callback call it mirrors
// and resumes the awaiting coroutine with its Result, or with a deadline error first.
#include "modules/kube/api/client.hpp"

#include "loop/awaitables.hpp"

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <utility>

namespace gns::kube {

namespace asio = boost::asio;

namespace {

// `call` against a timer of `within`. A coroutine, but its parameters are no closures (the
// g++ 12 pitfall of loop/awaitables.hpp is about those).
asio::awaitable<Result> Bounded(asio::io_context& io, std::chrono::milliseconds within, asio::awaitable<Result> call,
                                Gate::Ticket ticket) {
  Timed<Result> timed = co_await WithDeadline(io, within, std::move(call), std::move(ticket));
  if (timed.failure) std::rethrow_exception(timed.failure);  // a bug in a callback: not an answer
  if (timed.timed_out) {
    co_return Result{0, nullptr, std::string(kDeadlineExceeded) + " (" + std::to_string(within.count()) + " ms)"};
  }
  co_return std::move(*timed.value);
}

}  // namespace

asio::awaitable<Result> KubeClient::Awaited(std::function<void(Callback)> start, Deadline deadline,
                                            Gate::Ticket ticket) {
  auto begin = [start = std::move(start)](auto resume) { start(std::move(resume)); };
  if (deadline.within.count() <= 0) return AwaitCallback<Result>(std::move(begin), std::move(ticket));
  // The call runs on past its deadline (nothing recalls a request); its answer is dropped.
  auto call = AwaitCallback<Result>(std::move(begin));
  return Bounded(Io(), deadline.within, std::move(call), std::move(ticket));
}

asio::awaitable<Result> KubeClient::Get(const std::string& path, Deadline deadline, Gate::Ticket ticket) {
  return Awaited([this, path](Callback cb) { Get(path, std::move(cb)); }, deadline, std::move(ticket));
}

asio::awaitable<Result> KubeClient::List(const std::string& path, const ListOptions& options, Deadline deadline,
                                         Gate::Ticket ticket) {
  return Awaited([this, path, options](Callback cb) { List(path, options, std::move(cb)); }, deadline,
                 std::move(ticket));
}

asio::awaitable<Result> KubeClient::List(const std::string& path, const ListOptions& options,
                                         const Projection::Node& item_projection, CachedFn cached, Deadline deadline,
                                         Gate::Ticket ticket) {
  // Copied now, as the callback List copies it: the caller's projection may go before the
  // call is awaited.
  auto projection = std::make_shared<const Projection::Node>(item_projection);
  return Awaited(
      [this, path, options, projection = std::move(projection), cached = std::move(cached)](Callback cb) {
        List(path, options, projection, cached, std::move(cb));
      },
      deadline, std::move(ticket));
}

asio::awaitable<Result> KubeClient::Create(const std::string& collection_path, const nlohmann::json& object,
                                           Deadline deadline, Gate::Ticket ticket) {
  return Awaited([this, collection_path, object](Callback cb) { Create(collection_path, object, std::move(cb)); },
                 deadline, std::move(ticket));
}

asio::awaitable<Result> KubeClient::Update(const std::string& path, const nlohmann::json& object, Deadline deadline,
                                           Gate::Ticket ticket) {
  return Awaited([this, path, object](Callback cb) { Update(path, object, std::move(cb)); }, deadline,
                 std::move(ticket));
}

asio::awaitable<Result> KubeClient::Patch(const std::string& path, PatchType type, const nlohmann::json& body,
                                          const std::string& field_manager, Deadline deadline, Gate::Ticket ticket,
                                          bool force) {
  return Awaited([this, path, type, body, field_manager,
                  force](Callback cb) { Patch(path, type, body, field_manager, std::move(cb), force); },
                 deadline, std::move(ticket));
}

asio::awaitable<Result> KubeClient::Delete(const std::string& path, const Preconditions& preconditions,
                                           Deadline deadline, Gate::Ticket ticket) {
  return Awaited([this, path, preconditions](Callback cb) { Delete(path, preconditions, std::move(cb)); }, deadline,
                 std::move(ticket));
}

asio::awaitable<Result> KubeClient::UpdateStatus(const std::string& path, const nlohmann::json& object,
                                                 Deadline deadline, Gate::Ticket ticket) {
  return Awaited([this, path, object](Callback cb) { UpdateStatus(path, object, std::move(cb)); }, deadline,
                 std::move(ticket));
}

asio::awaitable<Result> KubeClient::PatchStatus(const std::string& path, PatchType type, const nlohmann::json& body,
                                                const std::string& field_manager, Deadline deadline,
                                                Gate::Ticket ticket, bool force) {
  return Awaited([this, path, type, body, field_manager,
                  force](Callback cb) { PatchStatus(path, type, body, field_manager, std::move(cb), force); },
                 deadline, std::move(ticket));
}

asio::awaitable<Result> KubeClient::Request(std::string_view verb, std::string_view method, std::string target,
                                            std::string body, std::string content_type, Deadline deadline,
                                            Gate::Ticket ticket) {
  return Awaited(
      [this, verb = std::string(verb), method = std::string(method), target = std::move(target),
       body = std::move(body), content_type = std::move(content_type)](Callback cb) {
        Request(verb, method, target, body, content_type, std::move(cb));
      },
      deadline, std::move(ticket));
}

}  // namespace gns::kube
