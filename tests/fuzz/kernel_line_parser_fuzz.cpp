// libFuzzer target for the kernel-line parser: any byte string must parse without a crash,
// a sanitizer report or a broken invariant (capped, printable UTF-8 strings; offsets inside
// the message). Built by run-fuzz.sh with clang++-14 -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "modules/gpu_health/kernel_line_parser.hpp"
#include "support/printable_utf8.hpp"

namespace {

using gns::gpu_health::ParsedLine;

using gns::test::PrintableUtf8;

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view message(reinterpret_cast<const char*>(data), size);
  const ParsedLine parsed = gns::gpu_health::ParseKernelLine(message);

  if (const auto* x = parsed.xid()) {
    const std::string detail = x->detail();
    Check(detail.size() <= gns::gpu_health::kMaxDetailBytes);
    Check(PrintableUtf8(detail));
    // Cut only when the next character (at most 4 bytes) would not have fitted.
    Check(!x->detail_truncated() || detail.size() + 4 > gns::gpu_health::kMaxDetailBytes);
    if (const auto name = x->process_name()) {
      Check(name->size() <= gns::gpu_health::kMaxProcessNameBytes);
      Check(PrintableUtf8(*name));
    }
    // The raw text is a view into the message.
    Check(x->raw_detail.empty() || (x->raw_detail.data() >= message.data() &&
                                    x->raw_detail.data() + x->raw_detail.size() <= message.data() + size));
    Check(x->pci.device <= 0x1F && x->pci.function <= 7);
  }
  if (const auto* u = parsed.gpu_uuid()) {
    Check(u->uuid.size() <= gns::gpu_health::kMaxUuidBytes && u->uuid.starts_with("GPU-"));
  }
  if (const auto* r = parsed.reset_ack()) {
    Check(r->uuid.size() <= gns::gpu_health::kMaxUuidBytes && r->uuid.starts_with("GPU-"));
  }
  if (const auto* m = parsed.malformed()) {
    Check(m->offset <= size && !m->expected.empty());
    Check(!m->Reason().empty());
  }

  // The address parser on its own, and its round trip.
  if (auto pci = gns::gpu_health::ParsePciAddress(message)) {
    auto again = gns::gpu_health::ParsePciAddress(pci->DeviceString());
    Check(again.has_value() && again->SameDevice(*pci));
  }
  return 0;
}
