// The gpu-reset record round-trips through its JSON, and a damaged one is refused with the
// place that is wrong; the journal sender's native-protocol encoding.
#include "modules/gpu_reset/journal_sender.hpp"
#include "modules/gpu_reset/reset_book.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

namespace gns::gpu_reset {
namespace {

ResetBook Sample() {
  ResetBook book;
  book.next_cli = 7;
  ResetJob job;
  job.id = "GPUReset/r1/uid-1";
  job.source = "GPUReset";
  job.object_name = "r1";
  job.object_uid = "uid-1";
  job.generation = 2;
  job.phase = "InProgress";
  job.created_unix_ms = 1000;
  job.started_unix_ms = 1001;
  GpuReset gpu = NewGpuReset("GPU-1");
  gpu.step = Step::kReset;
  gpu.persistence_was_on = true;
  gpu.released = true;
  gpu.steps.push_back({"hold", "ok", 1002, 5, "Unhealthy"});
  job.gpus.push_back(gpu);
  job.gpus.push_back(NewGpuReset("GPU-2"));
  book.jobs.push_back(job);
  return book;
}

TEST(ResetBookTest, RoundTripKeepsWhereEachGpuStands) {
  const ResetBook book = Sample();
  const nlohmann::json j = book;
  const ResetBook back = ParseResetBook(j.dump());
  ASSERT_EQ(back.jobs.size(), 1u);
  const ResetJob& job = back.jobs.front();
  EXPECT_EQ(back.next_cli, 7u);
  EXPECT_EQ(job.id, "GPUReset/r1/uid-1");
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(job.phase, "InProgress");
  ASSERT_EQ(job.gpus.size(), 2u);
  EXPECT_EQ(job.gpus[0].step, Step::kReset);
  EXPECT_EQ(job.gpus[0].persistence_was_on, std::optional<bool>(true));
  EXPECT_TRUE(job.gpus[0].released);
  ASSERT_EQ(job.gpus[0].steps.size(), 1u);
  EXPECT_EQ(job.gpus[0].steps[0].duration_ms, 5);
  EXPECT_EQ(job.gpus[1].step, Step::kQueued);
  EXPECT_FALSE(job.gpus[1].persistence_was_on.has_value()) << "unknown stays unknown";
}

TEST(ResetBookTest, DamagedRecordsNameWhatIsWrong) {
  auto fails = [](const std::string& text, const std::string& expected) {
    try {
      ParseResetBook(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  fails("{", "not JSON");
  fails("[]", "not an object");
  fails(R"({"version":9,"jobs":[]})", "version 9");
  fails(R"({"version":1})", "jobs is missing");
  fails(R"({"version":1,"jobs":[{"id":"a","gpus":[{"uuid":"GPU-1","step":"dance"}]}]})", "jobs[0].gpus[0].step");
  fails(R"({"version":1,"jobs":[{"id":"a","gpus":[]}]})", "jobs[0] names no GPU");
  fails(R"({"version":1,"jobs":[{"id":"a","phase":3,"gpus":[{"uuid":"GPU-1"}]}]})", "jobs[0].phase has the wrong type");
}

TEST(ResetBookTest, ActiveJobsAreFoundByGpuAndFinishedOnesTrimmed) {
  ResetBook book = Sample();
  EXPECT_NE(book.FindActiveFor("GPU-1"), nullptr);
  EXPECT_EQ(book.FindActiveFor("GPU-9"), nullptr);
  for (std::size_t i = 0; i < ResetBook::kMaxFinished + 5; ++i) {
    ResetJob done;
    done.id = "cli/" + std::to_string(i);
    done.source = "cli";
    done.phase = "Succeeded";
    done.gpus.push_back(NewGpuReset("GPU-1"));
    book.jobs.push_back(done);
  }
  book.Trim();
  EXPECT_EQ(book.jobs.size(), ResetBook::kMaxFinished + 1) << "the unfinished job stays";
  EXPECT_EQ(book.jobs.front().id, "GPUReset/r1/uid-1");
  EXPECT_EQ(book.Find("cli/0"), nullptr) << "the oldest finished ones go first";
}

TEST(JournalSenderTest, NativeProtocolEncodingAndADatagramOnTheSocket) {
  const std::string plain = EncodeJournalEntry({{"MESSAGE", "GPU reset occurred: GPU-1"}, {"PRIORITY", "6"}});
  EXPECT_EQ(plain, "MESSAGE=GPU reset occurred: GPU-1\nPRIORITY=6\n");
  const std::string binary = EncodeJournalEntry({{"MESSAGE", "a\nb"}});
  EXPECT_EQ(binary, std::string("MESSAGE\n\x03\0\0\0\0\0\0\0a\nb\n", 20));

  const std::string path = (std::filesystem::temp_directory_path() / ("gns-jsend-" + std::to_string(::getpid()))).string();
  ::unlink(path.c_str());
  EXPECT_NE(SendJournalEntry(path, {{"MESSAGE", "x"}}).find("writing to the journal at " + path), std::string::npos);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(SendJournalEntry(path, {{"MESSAGE", "hello"}, {"SYSLOG_IDENTIFIER", "gpu-reset"}}), "");
  char buffer[256];
  const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
  EXPECT_EQ(std::string(buffer, static_cast<std::size_t>(std::max<ssize_t>(n, 0))), "MESSAGE=hello\nSYSLOG_IDENTIFIER=gpu-reset\n");
  ::close(fd);
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace gns::gpu_reset
