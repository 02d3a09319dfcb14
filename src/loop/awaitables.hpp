#pragma once
// Awaiting the loop's callback world from C++20 coroutines (asio::awaitable), one way for every
// module:
//   AwaitCallback<T>(start)     a callback API as an awaitable: start(resume), resume(T) on the loop;
//   OnPool(pool, work)          a BlockingPool job: resumes on the loop with its value or exception;
//   StartOnPool / Pending<T>    a job (or any completion) started now and awaited later;
//   Both(io, a, b)              two awaitables under way at once, resumed with both values;
//   WithDeadline(io, limit, a)  an awaitable with a time limit, the timeout as a value.
// Each takes an optional Gate::Ticket (loop/gate.hpp): a completion that arrives once the gate
// is closed resumes nothing. The waiting coroutine is then dropped: its frames are destroyed
// (through the loop, when the last handler goes) without running another line of it, so it
// never touches the module that closed the gate.
//
// Boost 1.74: no as_tuple, no awaitable operators (||, &&), no per-operation cancellation;
// these are built on async_initiate and co_spawn instead. Errors of the work come back as
// values (JobResult::failure, Timed::timed_out); exceptions of a coroutine in Both propagate.
//
// THE g++ 12 PITFALL. g++ 12 miscompiles a temporary that lives inside a co_await expression
// when the awaited function takes it by value: a lambda, a std::function made from one or a
// braced temporary written in `co_await OnPool(pool, [..] {..})` is destroyed twice (under
// ASan: "attempting double-free" on the buffer of a captured string; without it, silent heap
// corruption). The same happens to closure parameters of a function that is itself a
// coroutine. Hence two rules:
//   - the helpers below are NOT coroutines: they hand their arguments to async_initiate and
//     return its awaitable, so nothing they take by value lives in a coroutine frame of theirs;
//   - callers pass named locals, moved:   auto write = [..] {..};
//                                         auto written = co_await OnPool(pool, std::move(write));
//     never a lambda, a std::function or a braced temporary spelled inside the co_await.
// tests/unit/loop/awaitables_test.cpp exercises the safe pattern under ASan.

#include "loop/blocking_pool.hpp"
#include "loop/gate.hpp"

#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace gns {

namespace awaitables_detail {
// use_awaitable's handler is move-only; the callback APIs it is handed to take a copyable
// std::function, so the handler travels in a shared_ptr (invoked at most once).
template <typename Handler>
auto ShareHandler(Handler&& handler) {
  return std::make_shared<std::decay_t<Handler>>(std::forward<Handler>(handler));
}
}  // namespace awaitables_detail

// `start(resume)` begins a callback operation; `resume(value)` (`resume()` for T = void), its
// completion on the loop, resumes the awaiting coroutine with `value`. `resume` is copyable and
// must be called at most once, on the loop thread; a completion that arrives once `ticket`'s
// gate is closed resumes nothing (the coroutine is dropped).
template <typename T, typename Start>
boost::asio::awaitable<T> AwaitCallback(Start start, Gate::Ticket ticket = {}) {
  namespace asio = boost::asio;
  if constexpr (std::is_void_v<T>) {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code)>(
        [start = std::move(start), ticket = std::move(ticket)](auto handler) mutable {
          auto shared = awaitables_detail::ShareHandler(std::move(handler));
          start([shared, ticket] {
            if (!ticket) return;
            std::move (*shared)(boost::system::error_code{});
          });
        },
        asio::use_awaitable);
  } else {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code, T)>(
        [start = std::move(start), ticket = std::move(ticket)](auto handler) mutable {
          auto shared = awaitables_detail::ShareHandler(std::move(handler));
          start([shared, ticket](T value) {
            if (!ticket) return;
            std::move (*shared)(boost::system::error_code{}, std::move(value));
          });
        },
        asio::use_awaitable);
  }
}

// What a pool job gave back: its value (default-made if it threw) and its exception.
template <typename T>
struct JobResult {
  T value{};
  std::exception_ptr failure;
};
template <>
struct JobResult<void> {
  std::exception_ptr failure;
};

template <typename Work>
using JobResultOf = JobResult<std::invoke_result_t<Work&>>;

namespace awaitables_detail {
// BlockingPool::Run's completion (value, error) or (error), as one JobResult.
template <typename T, typename Deliver>
auto CollectJob(Deliver deliver) {
  if constexpr (std::is_void_v<T>) {
    return [deliver = std::move(deliver)](std::exception_ptr failure) mutable { deliver(JobResult<void>{failure}); };
  } else {
    return [deliver = std::move(deliver)](T value, std::exception_ptr failure) mutable {
      deliver(JobResult<T>{std::move(value), failure});
    };
  }
}
}  // namespace awaitables_detail

// Runs `work` on the pool; resumes on the loop with its result (see the pitfall above: pass
// `work` as a named local, moved). `work` must not touch module state: it runs off the loop.
template <typename Work>
boost::asio::awaitable<JobResultOf<Work>> OnPool(BlockingPool& pool, Work work, Gate::Ticket ticket = {}) {
  using T = std::invoke_result_t<Work&>;
  return AwaitCallback<JobResult<T>>(
      [&pool, work = std::move(work)](auto resume) mutable {
        pool.Run(std::move(work), awaitables_detail::CollectJob<T>(std::move(resume)));
      },
      std::move(ticket));
}

// A one-shot completion awaited later: Complete(value) from a callback on the loop, Wait() from
// a coroutine, in either order. One waiter at most. Held by shared_ptr by both sides.
template <typename T>
class Pending {
 public:
  explicit Pending(boost::asio::io_context& io) : wake_(io, boost::asio::steady_timer::time_point::max()) {}

  bool Done() const { return value_.has_value(); }

  void Complete(T value) {
    if (value_) return;  // the first completion stands
    value_.emplace(std::move(value));
    wake_.cancel();
  }

  // Yields the value once completed (moved out: wait once). Not a coroutine of a closure:
  // `self` is a plain shared_ptr parameter.
  static boost::asio::awaitable<T> Wait(std::shared_ptr<Pending> self) {
    if (!self->value_) {
      boost::system::error_code ec;  // operation_aborted is the signal, not an error
      co_await self->wake_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    }
    co_return std::move(*self->value_);
  }

 private:
  std::optional<T> value_;
  boost::asio::steady_timer wake_;  // cancelled by Complete: the event a waiter sleeps on
};

// A pool job started now and awaited later with Pending<…>::Wait (the loop does other work
// meanwhile: reads the next chunk while the pool writes this one).
template <typename Work>
std::shared_ptr<Pending<JobResultOf<Work>>> StartOnPool(BlockingPool& pool, boost::asio::io_context& io, Work work) {
  using T = std::invoke_result_t<Work&>;
  auto pending = std::make_shared<Pending<JobResult<T>>>(io);
  pool.Run(std::move(work),
           awaitables_detail::CollectJob<T>([pending](JobResult<T> result) { pending->Complete(std::move(result)); }));
  return pending;
}

// Runs `a` and `b` at once (each co_spawned on `io`: both are under way before either is done)
// and resumes with both values when both are done; the first exception (in completion order)
// is rethrown in the awaiting coroutine. Only the two runs hold the waiting coroutine: when
// the gate closed before the second finished, it is dropped.
template <typename A, typename B>
boost::asio::awaitable<std::pair<A, B>> Both(boost::asio::io_context& io, boost::asio::awaitable<A> a,
                                             boost::asio::awaitable<B> b, Gate::Ticket ticket = {}) {
  namespace asio = boost::asio;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr, std::pair<A, B>)>(
      [&io, ticket = std::move(ticket)](auto handler, asio::awaitable<A> a, asio::awaitable<B> b) {
        using Handler = decltype(handler);
        struct Join {
          Gate::Ticket ticket;
          Handler handler;
          std::pair<A, B> values{};
          std::exception_ptr failure{};
          int running = 2;
          void Done(std::exception_ptr e) {
            if (e && !failure) failure = e;
            if (--running > 0 || !ticket) return;
            std::move(handler)(failure, std::move(values));
          }
        };
        auto join = std::make_shared<Join>(Join{ticket, std::move(handler)});
        asio::co_spawn(io, std::move(a), [join](std::exception_ptr e, A value) {
          join->values.first = std::move(value);
          join->Done(e);
        });
        asio::co_spawn(io, std::move(b), [join](std::exception_ptr e, B value) {
          join->values.second = std::move(value);
          join->Done(e);
        });
      },
      asio::use_awaitable, std::move(a), std::move(b));
}

// An awaitable's outcome under a time limit: its value, or its exception, or the timeout.
template <typename T>
struct Timed {
  std::optional<T> value;     // set when it finished in time without throwing
  std::exception_ptr failure;  // set when it threw in time
  bool timed_out = false;      // the limit passed first
};

// Runs `work` (co_spawned on `io`) against a timer of `limit`; resumes with whichever comes
// first. Boost 1.74 cannot cancel a coroutine: at the timeout `work` runs on, and its result is
// discarded when it ends. A caller whose work waits on a socket or a timer closes or cancels it
// after a timeout, so the work ends (and frees what it holds) soon.
template <typename T>
boost::asio::awaitable<Timed<T>> WithDeadline(boost::asio::io_context& io, std::chrono::steady_clock::duration limit,
                                              boost::asio::awaitable<T> work, Gate::Ticket ticket = {}) {
  namespace asio = boost::asio;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code, Timed<T>)>(
      [&io, limit, ticket = std::move(ticket)](auto handler, asio::awaitable<T> work) {
        using Handler = decltype(handler);
        struct Race {
          Race(asio::io_context& io, Gate::Ticket ticket, Handler handler)
              : timer(io), ticket(std::move(ticket)), handler(std::move(handler)) {}
          asio::steady_timer timer;
          Gate::Ticket ticket;
          std::optional<Handler> handler;  // taken by the first to finish
          void Finish(Timed<T> outcome) {
            if (!handler) return;
            auto h = std::move(*handler);
            handler.reset();
            timer.cancel();  // releases the timer's hold on the race
            if (!ticket) return;
            std::move(h)(boost::system::error_code{}, std::move(outcome));
          }
        };
        auto race = std::make_shared<Race>(io, ticket, std::move(handler));
        race->timer.expires_after(limit);
        race->timer.async_wait([race](const boost::system::error_code& ec) {
          if (ec) return;  // cancelled: the work finished first
          Timed<T> outcome;
          outcome.timed_out = true;
          race->Finish(std::move(outcome));
        });
        asio::co_spawn(io, std::move(work), [race](std::exception_ptr e, T value) {
          Timed<T> outcome;
          if (e) {
            outcome.failure = e;
          } else {
            outcome.value.emplace(std::move(value));
          }
          race->Finish(std::move(outcome));
        });
      },
      asio::use_awaitable, std::move(work));
}

}  // namespace gns
