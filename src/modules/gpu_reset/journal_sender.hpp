#pragma once
// Writes an entry to the journal with journald's native protocol: one datagram of
// "FIELD=value\n" lines (a value holding a newline goes as "FIELD\n", its length as 64-bit
// little endian, the bytes, "\n") sent to journald's socket (/run/systemd/journal/socket; under
// hostRoot in a container). Our own sender rather than sd_journal_send, whose socket path is
// fixed: the path is configurable, so the simulated node's journald receives the same bytes.

#include <string>
#include <utility>
#include <vector>

namespace gns::gpu_reset {

using JournalFields = std::vector<std::pair<std::string, std::string>>;

// The datagram for `fields` (exposed for tests).
std::string EncodeJournalEntry(const JournalFields& fields);

// Sends one entry; "" on success, else what failed (with the socket path). Never blocks long:
// the socket is non-blocking and a full journald queue is an error.
std::string SendJournalEntry(const std::string& socket_path, const JournalFields& fields);

}  // namespace gns::gpu_reset
