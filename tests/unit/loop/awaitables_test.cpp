// loop/gate and loop/awaitables on a real loop and pool: values and exceptions of pool jobs,
// completions after the gate closed dropped (the coroutine never runs another line, its frame
// is freed), two awaitables at once, a deadline, and the g++ 12 co_await pattern under ASan.
#include "loop/awaitables.hpp"
#include "loop/gate.hpp"
#include "support/held_pool.hpp"
#include "support/loop_harness.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gns {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;

// Spawns `make()`'s coroutine on the loop; records its end (value or exception).
template <typename T>
struct Spawned {
  bool ended = false;
  std::optional<T> value;
  std::exception_ptr failure;
};

template <typename T>
std::shared_ptr<Spawned<T>> Spawn(test::LoopHarness& h, asio::awaitable<T> coroutine) {
  auto out = std::make_shared<Spawned<T>>();
  asio::co_spawn(h.loop.Io(), std::move(coroutine), [out](std::exception_ptr e, T value) {
    out->ended = true;
    out->failure = e;
    if (!e) out->value.emplace(std::move(value));
  });
  return out;
}

// Sets `*flag` when destroyed: shows a coroutine frame was freed.
struct OnDestroy {
  std::shared_ptr<bool> flag;
  ~OnDestroy() { *flag = true; }
};

// ------------------------------------------------------------------------------------ Gate

TEST(GateTest, GuardRunsWhileOpenAndDropsAfterClose) {
  Gate gate;
  std::vector<int> seen;
  auto guarded = gate.Guard([&seen](int v) { seen.push_back(v); });
  std::function<void(int)> copy = guarded;  // copyable: callback APIs take std::function
  const auto& as_const = guarded;             // callable through a const reference too
  guarded(1);
  copy(2);
  as_const(3);
  gate.Close();
  guarded(4);
  copy(5);
  as_const(6);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(gate.IsOpen());
}

TEST(GateTest, RenewClosesWhatWasHandedOutAndOpensForWhatComes) {
  Gate gate;
  int old_runs = 0;
  int new_runs = 0;
  auto before = gate.Guard([&old_runs] { ++old_runs; });
  const Gate::Ticket old_ticket = gate.Watch();
  gate.Renew();  // a Stop that drops what is in flight
  auto after = gate.Guard([&new_runs] { ++new_runs; });
  before();
  after();
  EXPECT_EQ(old_runs, 0);
  EXPECT_EQ(new_runs, 1);
  EXPECT_FALSE(old_ticket.IsOpen());
  EXPECT_TRUE(gate.Watch().IsOpen());
  EXPECT_TRUE(gate.IsOpen());
}

TEST(GateTest, TicketsOutliveTheGateAndReadClosed) {
  Gate::Ticket ticket;
  EXPECT_TRUE(ticket.IsOpen());  // no gate: always open
  std::function<void()> late;
  int runs = 0;
  {
    Gate gate;
    ticket = gate.Watch();
    late = gate.Guard([&runs] { ++runs; });
    EXPECT_TRUE(ticket.IsOpen());
    late();
  }  // destroying the gate closes it
  EXPECT_FALSE(ticket.IsOpen());
  late();
  EXPECT_EQ(runs, 1);
}

// --------------------------------------------------------------------------------- OnPool

asio::awaitable<int> DoubleOnPool(BlockingPool& pool, int x) {
  auto work = [x] {
    EXPECT_NE(std::this_thread::get_id(), std::thread::id{});
    return 2 * x;
  };
  JobResult<int> r = co_await OnPool(pool, std::move(work));
  if (r.failure) std::rethrow_exception(r.failure);
  co_return r.value;
}

TEST(AwaitablesTest, PoolJobResumesOnTheLoopWithItsValue) {
  test::LoopHarness h;
  h.loop.BindToCurrentThread();
  bool on_loop = false;
  auto coroutine = [&]() -> asio::awaitable<int> {
    const int v = co_await DoubleOnPool(h.pool, 21);
    on_loop = h.loop.OnLoopThread();
    co_return v;
  };
  auto out = Spawn(h, coroutine());
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_FALSE(out->failure);
  EXPECT_EQ(out->value, 42);
  EXPECT_TRUE(on_loop);
}

asio::awaitable<std::string> FailOnPool(BlockingPool& pool) {
  auto work = []() -> void { throw std::runtime_error("disk on fire"); };
  JobResult<void> r = co_await OnPool(pool, std::move(work));
  if (!r.failure) co_return "no failure";
  try {
    std::rethrow_exception(r.failure);
  } catch (const std::exception& e) {
    co_return e.what();
  }
}

TEST(AwaitablesTest, PoolJobExceptionComesBackAsAValue) {
  test::LoopHarness h;
  auto out = Spawn(h, FailOnPool(h.pool));
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_FALSE(out->failure);
  EXPECT_EQ(out->value, "disk on fire");
}

asio::awaitable<int> GuardedPoolJob(BlockingPool& pool, Gate::Ticket ticket, std::shared_ptr<bool> frame_freed,
                                    std::shared_ptr<bool> resumed) {
  OnDestroy in_frame{std::move(frame_freed)};
  auto work = [] { return 7; };
  JobResult<int> r = co_await OnPool(pool, std::move(work), std::move(ticket));
  *resumed = true;
  co_return r.value;
}

TEST(AwaitablesTest, PoolJobFinishingAfterTheGateClosedResumesNothing) {
  test::LoopHarness h;
  auto gate = std::make_unique<Gate>();
  auto freed = std::make_shared<bool>(false);
  auto resumed = std::make_shared<bool>(false);
  std::shared_ptr<Spawned<int>> out;
  {
    test::HeldPool held(h.pool);  // the job waits until the gate is closed
    out = Spawn(h, GuardedPoolJob(h.pool, gate->Watch(), freed, resumed));
    h.Drain();  // the coroutine runs up to its co_await
    EXPECT_FALSE(*freed);
    gate.reset();  // the module is gone
  }
  ASSERT_TRUE(h.RunUntil([&] { return *freed; }));
  h.Drain();
  EXPECT_FALSE(*resumed);
  EXPECT_FALSE(out->ended);  // nobody hears of it: dropped, not finished
}

TEST(AwaitablesTest, StartedPoolJobIsAwaitedLaterInEitherOrder) {
  test::LoopHarness h;
  auto coroutine = [&]() -> asio::awaitable<int> {
    auto quick = [] { return 1; };
    auto first = StartOnPool(h.pool, h.loop.Io(), std::move(quick));
    // Awaited after it finished:
    while (!first->Done()) {
      asio::steady_timer tick(h.loop.Io(), milliseconds(1));
      co_await tick.async_wait(asio::use_awaitable);
    }
    JobResult<int> a = co_await Pending<JobResult<int>>::Wait(first);
    // Awaited before it finished (the pool is held until the loop lets it go):
    auto gate_open = std::make_shared<std::promise<void>>();
    auto slow = [opened = gate_open->get_future().share()] {
      opened.wait();
      return 2;
    };
    auto second = StartOnPool(h.pool, h.loop.Io(), std::move(slow));
    EXPECT_FALSE(second->Done());
    h.loop.Post([gate_open] { gate_open->set_value(); });
    JobResult<int> b = co_await Pending<JobResult<int>>::Wait(second);
    co_return a.value * 10 + b.value;
  };
  auto out = Spawn(h, coroutine());
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_FALSE(out->failure);
  EXPECT_EQ(out->value, 12);
}

// ------------------------------------------------------------------------------ AwaitCallback

TEST(AwaitablesTest, CallbackApiResumesWithItsValueAndVoidWorks) {
  test::LoopHarness h;
  std::function<void(std::string)> pending_string;
  std::function<void()> pending_void;
  std::vector<std::string> steps;
  auto coroutine = [&]() -> asio::awaitable<std::string> {
    auto start = [&](auto resume) { pending_string = resume; };
    std::string got = co_await AwaitCallback<std::string>(std::move(start));
    steps.push_back("got " + got);
    auto start_void = [&](auto resume) { pending_void = resume; };
    co_await AwaitCallback<void>(std::move(start_void));
    steps.push_back("void");
    co_return got;
  };
  auto out = Spawn(h, coroutine());
  h.Drain();
  ASSERT_TRUE(pending_string);
  EXPECT_TRUE(steps.empty());
  pending_string("hello");
  h.Drain();
  ASSERT_TRUE(pending_void);
  EXPECT_EQ(steps, (std::vector<std::string>{"got hello"}));
  pending_void();
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  EXPECT_EQ(out->value, "hello");
  EXPECT_EQ(steps, (std::vector<std::string>{"got hello", "void"}));
}

// ---------------------------------------------------------------------------------- Both

// Completes with `value` once `release` is called.
asio::awaitable<int> Later(std::function<void(std::function<void(int)>)> park) {
  return AwaitCallback<int>(std::move(park));
}

TEST(AwaitablesTest, BothRunAtOnceAndKeepTheirPlaces) {
  test::LoopHarness h;
  std::function<void(int)> resume_a;
  std::function<void(int)> resume_b;
  auto coroutine = [&]() -> asio::awaitable<std::pair<int, int>> {
    std::function<void(std::function<void(int)>)> park_a = [&](std::function<void(int)> r) { resume_a = r; };
    std::function<void(std::function<void(int)>)> park_b = [&](std::function<void(int)> r) { resume_b = r; };
    asio::awaitable<int> a = Later(std::move(park_a));
    asio::awaitable<int> b = Later(std::move(park_b));
    co_return co_await Both(h.loop.Io(), std::move(a), std::move(b));
  };
  auto out = Spawn(h, coroutine());
  h.Drain();
  // Both started before either finished.
  ASSERT_TRUE(resume_a);
  ASSERT_TRUE(resume_b);
  resume_b(2);  // the second finishes first
  h.Drain();
  EXPECT_FALSE(out->ended);
  resume_a(1);
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_FALSE(out->failure);
  EXPECT_EQ(out->value, std::make_pair(1, 2));
}

asio::awaitable<int> Throws() {
  throw std::runtime_error("a broke");
  co_return 0;
}
asio::awaitable<int> Three() { co_return 3; }

TEST(AwaitablesTest, BothRethrowsTheFirstException) {
  test::LoopHarness h;
  auto coroutine = [&]() -> asio::awaitable<std::pair<int, int>> {
    asio::awaitable<int> a = Throws();
    asio::awaitable<int> b = Three();
    co_return co_await Both(h.loop.Io(), std::move(a), std::move(b));
  };
  auto out = Spawn(h, coroutine());
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_TRUE(out->failure);
  EXPECT_THROW(std::rethrow_exception(out->failure), std::runtime_error);
}

TEST(AwaitablesTest, BothDroppedWhenTheGateClosesBeforeTheSecondEnds) {
  test::LoopHarness h;
  Gate gate;
  std::function<void(int)> resume_a;
  auto freed = std::make_shared<bool>(false);
  bool resumed = false;
  auto coroutine = [&](std::shared_ptr<bool> frame_freed) -> asio::awaitable<int> {
    OnDestroy in_frame{std::move(frame_freed)};
    std::function<void(std::function<void(int)>)> park_a = [&](std::function<void(int)> r) { resume_a = r; };
    asio::awaitable<int> a = Later(std::move(park_a));
    asio::awaitable<int> b = Three();
    auto both = co_await Both(h.loop.Io(), std::move(a), std::move(b), gate.Watch());
    resumed = true;
    co_return both.first;
  };
  auto out = Spawn(h, coroutine(freed));
  h.Drain();
  ASSERT_TRUE(resume_a);
  gate.Close();
  resume_a(1);
  resume_a = nullptr;  // the last hold on the waiting coroutine
  ASSERT_TRUE(h.RunUntil([&] { return *freed; }));
  EXPECT_FALSE(resumed);
  EXPECT_FALSE(out->ended);
}

// ------------------------------------------------------------------------------- Deadline

asio::awaitable<int> AfterTimer(asio::steady_timer& timer, int value) {
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  co_return value;
}

TEST(AwaitablesTest, DeadlineFiresFirstAndTheLateResultIsDiscarded) {
  test::LoopHarness h;
  asio::steady_timer slow(h.loop.Io(), std::chrono::hours(1));  // cancelled by hand below
  auto coroutine = [&]() -> asio::awaitable<Timed<int>> {
    asio::awaitable<int> work = AfterTimer(slow, 5);
    co_return co_await WithDeadline(h.loop.Io(), milliseconds(20), std::move(work));
  };
  auto out = Spawn(h, coroutine());
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
  ASSERT_FALSE(out->failure);
  EXPECT_TRUE(out->value->timed_out);
  EXPECT_FALSE(out->value->value);
  slow.cancel();  // the work ends now; its result goes nowhere
  h.Drain();
  EXPECT_TRUE(out->value->timed_out);
}

TEST(AwaitablesTest, DeadlineNotReachedGivesTheValueOrTheException) {
  test::LoopHarness h;
  auto coroutine = [&]() -> asio::awaitable<std::pair<Timed<int>, Timed<int>>> {
    asio::awaitable<int> quick = Three();
    Timed<int> ok = co_await WithDeadline(h.loop.Io(), std::chrono::hours(1), std::move(quick));
    asio::awaitable<int> broken = Throws();
    Timed<int> failed = co_await WithDeadline(h.loop.Io(), std::chrono::hours(1), std::move(broken));
    co_return std::make_pair(std::move(ok), std::move(failed));
  };
  auto out = Spawn(h, coroutine());
  // The hour-long timers are cancelled when the work ends: the loop runs dry well before them.
  ASSERT_TRUE(h.RunUntil([&] { return out->ended; }, milliseconds(5000)));
  ASSERT_FALSE(out->failure);
  const auto& [ok, failed] = *out->value;
  EXPECT_FALSE(ok.timed_out);
  EXPECT_EQ(ok.value, 3);
  EXPECT_FALSE(ok.failure);
  EXPECT_FALSE(failed.timed_out);
  EXPECT_FALSE(failed.value);
  EXPECT_TRUE(failed.failure);
}

// ------------------------------------------------------------------ the g++ 12 co_await pitfall

// Counts live copies and catches a second destruction of the same object (the miscompiled
// temporary: its destructor runs twice). The captured string owns a heap buffer, so ASan also
// reports the double free.
struct Tracked {
  static inline int live = 0;
  static inline int double_destroyed = 0;
  std::string payload = std::string(64, 'x');
  bool destroyed = false;
  Tracked() { ++live; }
  Tracked(const Tracked& o) : payload(o.payload) { ++live; }
  Tracked(Tracked&& o) noexcept : payload(std::move(o.payload)) { ++live; }
  ~Tracked() {
    if (destroyed) ++double_destroyed;
    destroyed = true;
    --live;
  }
};

asio::awaitable<std::size_t> SafePattern(BlockingPool& pool) {
  // The rule the helpers require: the callable is a named local, moved into the helper,
  // never a lambda written inside the co_await expression.
  Tracked tracked;
  auto work = [tracked] { return tracked.payload.size(); };
  JobResult<std::size_t> r = co_await OnPool(pool, std::move(work));
  auto start = [tracked](auto resume) { resume(tracked.payload.size() + 1); };
  std::size_t more = co_await AwaitCallback<std::size_t>(std::move(start));
  co_return r.value + more;
}

TEST(AwaitablesTest, NamedLocalsMovedIntoTheHelpersAreDestroyedOnce) {
  test::LoopHarness h;
  Tracked::live = 0;
  Tracked::double_destroyed = 0;
  for (int i = 0; i < 20; ++i) {
    auto out = Spawn(h, SafePattern(h.pool));
    ASSERT_TRUE(h.RunUntil([&] { return out->ended; }));
    ASSERT_FALSE(out->failure);
    EXPECT_EQ(out->value, 64u + 65u);
  }
  h.Drain();
  EXPECT_EQ(Tracked::double_destroyed, 0);
  EXPECT_EQ(Tracked::live, 0);
}

}  // namespace
}  // namespace gns
