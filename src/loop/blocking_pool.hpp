#pragma once
// A small thread pool for work that blocks (fsync, NVML calls, DNS): the work runs off the
// loop and its result is posted back to the loop. Module state never travels to the pool.

#include "loop/loop.hpp"

#include <boost/asio/thread_pool.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace gns {

class BlockingPool {
 public:
  BlockingPool(Loop& loop, std::size_t threads);
  ~BlockingPool();
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Runs `work` on the pool, then `done(result, error)` on the loop. `error` is set (and
  // result default-constructed) if `work` threw.
  template <typename Work, typename Done>
  void Run(Work work, Done done) {
    using Result = std::invoke_result_t<Work>;
    boost::asio::post(pool_, [this, work = std::move(work), done = std::move(done)]() mutable {
      std::exception_ptr error;
      if constexpr (std::is_void_v<Result>) {
        try {
          work();
        } catch (...) {
          error = std::current_exception();
        }
        loop_.Post([done = std::move(done), error]() mutable { done(error); });
      } else {
        Result result{};
        try {
          result = work();
        } catch (...) {
          error = std::current_exception();
        }
        loop_.Post([done = std::move(done), result = std::move(result), error]() mutable {
          done(std::move(result), error);
        });
      }
    });
  }

  // Runs `work` on the pool without a completion (fire and forget).
  void Execute(std::function<void()> work);

  // Stops accepting work and joins the threads (pending work still runs).
  void Join();

 private:
  Loop& loop_;
  boost::asio::thread_pool pool_;
  bool joined_ = false;
};

}  // namespace gns
