// The blocking-work pool.
#include "loop/blocking_pool.hpp"

namespace gns {

BlockingPool::BlockingPool(Loop& loop, std::size_t threads) : loop_(loop), pool_(threads) {}

BlockingPool::~BlockingPool() { Join(); }

void BlockingPool::Execute(std::function<void()> work) { boost::asio::post(pool_, std::move(work)); }

void BlockingPool::Join() {
  if (joined_) return;
  joined_ = true;
  pool_.join();
}

}  // namespace gns
