// /proc/self readers.
#include "modules/metrics/process_stats.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace gns::metrics {

namespace {

uint64_t StatusKilobytes(const std::string& line, const char* key) {
  const std::size_t len = std::strlen(key);
  if (line.compare(0, len, key) != 0) return 0;
  return std::strtoull(line.c_str() + len, nullptr, 10) * 1024;
}

}  // namespace

ProcessStats ReadProcessStats(const std::string& proc_self) {
  ProcessStats stats;
  std::ifstream status(proc_self + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) stats.vm_rss_bytes = StatusKilobytes(line, "VmRSS:");
    else if (line.starts_with("RssAnon:")) stats.rss_anon_bytes = StatusKilobytes(line, "RssAnon:");
    else if (line.starts_with("Threads:")) stats.threads = std::strtoull(line.c_str() + 8, nullptr, 10);
  }

  // /proc/self/stat: "pid (comm) state ..." — comm may contain spaces and ')', so parse from
  // the last ')'. utime and stime are fields 14 and 15 (1-based), in clock ticks.
  std::ifstream stat_file(proc_self + "/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  if (const auto close = stat.rfind(')'); close != std::string::npos) {
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int index = 3; rest >> field; ++index) {
      if (index == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (index == 15) {
        stime = std::strtoull(field.c_str(), nullptr, 10);
        break;
      }
    }
    const long ticks = ::sysconf(_SC_CLK_TCK);
    if (ticks > 0) stats.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(ticks);
  }

  if (DIR* dir = ::opendir((proc_self + "/fd").c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') ++stats.open_fds;
    }
    ::closedir(dir);
    if (stats.open_fds > 0) --stats.open_fds;  // the directory handle we just used
  }
  return stats;
}

}  // namespace gns::metrics
