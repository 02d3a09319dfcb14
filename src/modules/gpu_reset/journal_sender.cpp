// journald's native protocol over a unix datagram socket (see journal_sender.hpp).
#include "modules/gpu_reset/journal_sender.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace gns::gpu_reset {

std::string EncodeJournalEntry(const JournalFields& fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    out += name;
    if (value.find('\n') == std::string::npos) {
      out += '=';
      out += value;
    } else {
      out += '\n';
      uint64_t size = value.size();
      for (int i = 0; i < 8; ++i) out += static_cast<char>((size >> (8 * i)) & 0xFF);
      out += value;
    }
    out += '\n';
  }
  return out;
}

std::string SendJournalEntry(const std::string& socket_path, const JournalFields& fields) {
  sockaddr_un address{};
  if (socket_path.size() >= sizeof(address.sun_path)) return "journal socket path too long: " + socket_path;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return std::string("socket: ") + std::strerror(errno);
  const std::string datagram = EncodeJournalEntry(fields);
  ssize_t n;
  do {
    n = ::sendto(fd, datagram.data(), datagram.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&address),
                 sizeof(address));
  } while (n < 0 && errno == EINTR);
  const int e = errno;
  ::close(fd);
  if (n < 0) return "writing to the journal at " + socket_path + ": " + std::strerror(e);
  if (static_cast<std::size_t>(n) != datagram.size()) return "short write to the journal at " + socket_path;
  return "";
}

}  // namespace gns::gpu_reset
