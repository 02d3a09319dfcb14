// JournalWaiter: sd-journal's fd raced with the timeout it asks for. A pipe stands in for the
// fd (it becomes readable only when the test writes to it) and the timeout is injected, so
// the timeout path is driven without a file system that lacks inotify. The last test does the
// same with a real sd-journal reading real journal files.
#include "modules/journald/journal_waiter.hpp"
#include "support/loop_harness.hpp"

#ifdef GNS_HAVE_JOURNAL_REMOTE
#include "journal_writer.h"

#include <systemd/sd-journal.h>

#include <filesystem>
#endif

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace gns::journald {

// Readable failure messages for std::vector<Cause>.
void PrintTo(JournalWaiter::Cause cause, std::ostream* os) { *os << JournalWaiter::CauseName(cause); }

namespace {

using std::chrono::milliseconds;
using Cause = JournalWaiter::Cause;

uint64_t InUsec(milliseconds d) { return MonotonicUsec() + static_cast<uint64_t>(d.count()) * 1000; }

class JournalWaiterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::pipe2(pipe_, O_NONBLOCK | O_CLOEXEC), 0) << std::strerror(errno); }

  void TearDown() override {
    waiter_.reset();  // releases pipe_[0], never closes it
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }

  // `rearm`: the wake callback arms again at once, as the module does after reading.
  void Make(bool rearm) {
    waiter_ = std::make_unique<JournalWaiter>(h_.loop.Io(), pipe_[0],
                                              JournalWaiter::Callbacks{
                                                  [this] {
                                                    ++timeout_calls_;
                                                    return timeout_();
                                                  },
                                                  [this, rearm](Cause cause) {
                                                    wakes_.push_back(cause);
                                                    if (rearm) waiter_->Arm();
                                                  },
                                                  [this](const std::string& why) { failures_.push_back(why); }});
  }

  void MakeReadable() { ASSERT_EQ(::write(pipe_[1], "x", 1), 1); }

  std::size_t Count(Cause cause) const {
    std::size_t n = 0;
    for (const auto c : wakes_) n += c == cause ? 1 : 0;
    return n;
  }

  // Turns the loop for `d` (no condition): what happens meanwhile is what the test checks.
  void RunFor(milliseconds d) { h_.RunUntil([] { return false; }, d); }

  test::LoopHarness h_;
  int pipe_[2] = {-1, -1};
  std::function<uint64_t()> timeout_ = [] { return JournalWaiter::kNoTimeout; };
  std::unique_ptr<JournalWaiter> waiter_;
  std::vector<Cause> wakes_;
  std::vector<std::string> failures_;
  int timeout_calls_ = 0;
};

TEST_F(JournalWaiterTest, TimeoutWakesWhenTheFdNeverBecomesReadable) {
  timeout_ = [] { return InUsec(milliseconds(20)); };
  Make(/*rearm=*/true);
  waiter_->Arm();
  ASSERT_TRUE(waiter_->TimerDelay().has_value());
  // Polls on: every round asks again and wakes by the timer, with nothing on the fd.
  ASSERT_TRUE(h_.RunUntil([&] { return wakes_.size() >= 3; }));
  EXPECT_EQ(Count(Cause::kTimeout), wakes_.size());
  EXPECT_EQ(timeout_calls_, static_cast<int>(wakes_.size()) + 1);  // once per Arm()
  EXPECT_TRUE(failures_.empty());
}

TEST_F(JournalWaiterTest, ReadableFdWakesWithoutWaitingForTheTimeout) {
  timeout_ = [] { return InUsec(std::chrono::hours(1)); };
  Make(/*rearm=*/false);
  waiter_->Arm();
  MakeReadable();
  ASSERT_TRUE(h_.RunUntil([&] { return !wakes_.empty(); }));
  EXPECT_EQ(wakes_, std::vector<Cause>{Cause::kFd});
  EXPECT_FALSE(waiter_->Armed());
}

TEST_F(JournalWaiterTest, OneWakePerArmTheFdWinsAndTheTimerIsCancelled) {
  timeout_ = [] { return InUsec(milliseconds(50)); };
  Make(/*rearm=*/false);
  MakeReadable();
  waiter_->Arm();
  ASSERT_TRUE(h_.RunUntil([&] { return !wakes_.empty(); }));
  EXPECT_EQ(wakes_, std::vector<Cause>{Cause::kFd});
  RunFor(milliseconds(300));  // well past the timeout of that round
  EXPECT_EQ(wakes_, std::vector<Cause>{Cause::kFd});
}

TEST_F(JournalWaiterTest, NoTimeoutArmsNoTimerAndNothingRunsWithoutTheFd) {
  Make(/*rearm=*/false);  // timeout_: kNoTimeout
  waiter_->Arm();
  EXPECT_FALSE(waiter_->TimerDelay().has_value());
  RunFor(milliseconds(200));
  EXPECT_TRUE(wakes_.empty());
  EXPECT_EQ(timeout_calls_, 1);
  // Still waiting on the fd.
  MakeReadable();
  ASSERT_TRUE(h_.RunUntil([&] { return !wakes_.empty(); }));
  EXPECT_EQ(wakes_, std::vector<Cause>{Cause::kFd});
}

TEST_F(JournalWaiterTest, ATimeoutAlwaysDueDoesNotSpin) {
  timeout_ = [] { return uint64_t{0}; };  // "now", every time
  Make(/*rearm=*/true);
  waiter_->Arm();
  EXPECT_TRUE(wakes_.empty());  // never synchronous: through the loop's queue
  EXPECT_EQ(waiter_->TimerDelay(), std::chrono::microseconds(0));
  // It keeps polling (the first wake at once, then no more often than the floor allows)...
  ASSERT_TRUE(h_.RunUntil([&] { return wakes_.size() >= 2; }));
  // ...but it is no hot loop: over a measured stretch, at most one wake per
  // kMinTimeoutInterval (plus the edges). A slower machine only wakes less often.
  const std::size_t before = wakes_.size();
  const int calls_before = timeout_calls_;
  const auto start = std::chrono::steady_clock::now();
  RunFor(milliseconds(500));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const auto bound = static_cast<std::size_t>(elapsed / JournalWaiter::kMinTimeoutInterval) + 2;
  EXPECT_LE(wakes_.size() - before, bound);
  EXPECT_LE(timeout_calls_ - calls_before, static_cast<int>(bound));
  EXPECT_EQ(Count(Cause::kTimeout), wakes_.size());
}

TEST_F(JournalWaiterTest, FdReadableDuringATimeoutRoundIsSeenAtTheNextArm) {
  timeout_ = [] { return InUsec(milliseconds(10)); };
  Make(/*rearm=*/false);
  waiter_->Arm();
  ASSERT_TRUE(h_.RunUntil([&] { return !wakes_.empty(); }));
  EXPECT_EQ(wakes_, std::vector<Cause>{Cause::kTimeout});
  // The round woken by the timer is still "processing" when the fd becomes readable: its
  // fd wait completes with nobody armed. Nothing is lost: the next Arm() wakes by the fd.
  MakeReadable();
  RunFor(milliseconds(50));
  EXPECT_EQ(wakes_.size(), 1u);
  timeout_ = [] { return JournalWaiter::kNoTimeout; };
  waiter_->Arm();
  ASSERT_TRUE(h_.RunUntil([&] { return wakes_.size() == 2; }));
  EXPECT_EQ(wakes_[1], Cause::kFd);
}

TEST_F(JournalWaiterTest, CloseDeliversNothingAndLeavesTheFdOpen) {
  timeout_ = [] { return InUsec(milliseconds(5)); };
  Make(/*rearm=*/true);
  waiter_->Arm();
  MakeReadable();
  waiter_->Close();
  waiter_->Arm();  // a no-op once closed
  RunFor(milliseconds(100));
  EXPECT_TRUE(wakes_.empty());
  EXPECT_NE(::fcntl(pipe_[0], F_GETFD), -1);  // released, not closed: it is sd-journal's
}

#ifdef GNS_HAVE_JOURNAL_REMOTE
// The module's processing path on real journal files, woken only by the timeout: the fd
// waited on is a pipe nobody writes to, so entries appended to the journal can only be
// found by sd_journal_process after a timeout, as on a file system without inotify.
TEST_F(JournalWaiterTest, TimeoutPathDeliversJournalEntriesWhenTheFdNeverWakes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gns-journal-waiter-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  sim::JournalWriter writer(dir.string());
  writer.Append(sim::JournalWriter::Kernel("before"));
  sd_journal* raw = nullptr;
  ASSERT_GE(sd_journal_open_directory(&raw, dir.c_str(), 0), 0);
  std::unique_ptr<sd_journal, void (*)(sd_journal*)> journal(raw, [](sd_journal* j) { sd_journal_close(j); });
  ASSERT_GE(sd_journal_get_fd(journal.get()), 0);  // its inotify fd: deliberately not waited on
  ASSERT_GE(sd_journal_seek_tail(journal.get()), 0);
  ASSERT_GE(sd_journal_previous(journal.get()), 0);  // stand on "before": only new entries follow

  std::vector<std::string> messages;
  auto read = [&] {
    ASSERT_GE(sd_journal_process(journal.get()), 0);
    while (sd_journal_next(journal.get()) > 0) {
      const void* data = nullptr;
      size_t length = 0;
      if (sd_journal_get_data(journal.get(), "MESSAGE", &data, &length) >= 0) {
        messages.emplace_back(static_cast<const char*>(data) + 8, length - 8);  // after "MESSAGE="
      }
    }
  };
  timeout_ = [] { return InUsec(milliseconds(20)); };
  waiter_ = std::make_unique<JournalWaiter>(h_.loop.Io(), pipe_[0],
                                            JournalWaiter::Callbacks{[this] { return timeout_(); },
                                                                     [&](Cause cause) {
                                                                       wakes_.push_back(cause);
                                                                       read();
                                                                       waiter_->Arm();
                                                                     },
                                                                     [this](const std::string& why) {
                                                                       failures_.push_back(why);
                                                                     }});
  waiter_->Arm();
  writer.Append({sim::JournalWriter::Kernel("after 1"), sim::JournalWriter::Kernel("after 2")});
  ASSERT_TRUE(h_.RunUntil([&] { return messages.size() >= 2; }));
  writer.Append(sim::JournalWriter::Kernel("after 3"));
  ASSERT_TRUE(h_.RunUntil([&] { return messages.size() >= 3; }));
  EXPECT_EQ(messages, (std::vector<std::string>{"after 1", "after 2", "after 3"}));
  EXPECT_EQ(Count(Cause::kFd), 0u);
  EXPECT_TRUE(failures_.empty());
  waiter_.reset();  // before the capture of `read` goes
  journal.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}
#endif

}  // namespace
}  // namespace gns::journald
