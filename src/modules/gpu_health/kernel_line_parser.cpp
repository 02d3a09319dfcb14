// Hand-written scanner for the NVRM kernel lines listed in kernel_line_parser.hpp. No regex:
// std::regex allocates, recurses and is slow on long input, and the fuzz target would spend
// its time inside it. Formats follow the driver's printf strings (krcReportXid_IMPL,
// _krcLogUuidOnce, NV_DEV_PRINTF, the probe-time "fallen off the bus" message) and the
// NVSentinel GPU reset job's syslog line; see WIRE-FACTS.md §9.3.
#include "modules/gpu_health/kernel_line_parser.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

// GNS_KERNEL_LINE_SCALAR forces the plain loops that ARM nodes (GB200's Grace) run, so x86 CI
// tests them too (gpu_health_kernel_line_parser_scalar_test).
#if defined(__SSE2__) && !defined(GNS_KERNEL_LINE_SCALAR)
#define GNS_KERNEL_LINE_SSE2 1
#include <emmintrin.h>
#endif

namespace gns::gpu_health {
namespace {

constexpr std::string_view kNvrm = "NVRM";
constexpr std::string_view kXidMarker = "NVRM: Xid";
constexpr std::string_view kGpuAtMarker = "NVRM: GPU at PCI:";
constexpr std::string_view kTheGpuMarker = "NVRM: The NVIDIA GPU ";
constexpr std::string_view kDevPrintfMarker = "NVRM: GPU ";
constexpr std::string_view kFallenText = "fallen off the bus";
// nvswitch_os_print of the NVSwitch driver: "nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x): ".
constexpr std::string_view kSxidMarker = "SXid (PCI:";
constexpr std::string_view kNvSwitchPrefix = "nvidia-nvswitch";
// The design document (seed 003) names "occurred"; the reset job as shipped writes
// "executed", later with ", success: true|false". Accept all three.
constexpr std::string_view kResetExecuted = "GPU reset executed: ";
constexpr std::string_view kResetOccurred = "GPU reset occurred: ";
// Ours (the gpu-reset module): a reset of this GPU begins; it is held Unhealthy until the
// "occurred" line (or a failed "executed" one) ends it.
constexpr std::string_view kResetStarted = "GPU reset started: ";
constexpr std::string_view kResetCommon = "GPU reset ";  // how all of the above start
constexpr std::string_view kUuidPrefix = "GPU-";
constexpr std::string_view kUnknownQuoted = "'<unknown>'";
constexpr std::string_view kUnknown = "<unknown>";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint32_t HexValue(char c) {
  if (IsDigit(c)) return static_cast<uint32_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<uint32_t>(c - 'a' + 10);
  return static_cast<uint32_t>(c - 'A' + 10);
}
bool IsLineEnd(char c) { return c == '\n' || c == '\r'; }
bool IsBlank(char c) { return c == ' ' || c == '\t'; }
// Copied unchanged by CopySanitized: ' ' .. '~'.
bool IsPlainAscii(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x20 && u < 0x7F;
}

enum class NumberStatus { kOk, kMissing, kTooLarge };
struct Number {
  NumberStatus status = NumberStatus::kMissing;
  uint32_t value = 0;
};

// A read position in the message. Every method stays inside the view.
class Cursor {
 public:
  Cursor(std::string_view text, std::size_t pos) : text_(text), pos_(std::min(pos, text.size())) {}

  [[nodiscard]] std::size_t pos() const { return pos_; }
  [[nodiscard]] bool AtLineEnd() const { return pos_ >= text_.size() || IsLineEnd(text_[pos_]); }
  [[nodiscard]] bool Peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  [[nodiscard]] bool StartsWith(std::string_view lit) const {
    // pos_ <= size always; a memcmp of a literal's constant length is inlined.
    return text_.size() - pos_ >= lit.size() && std::memcmp(text_.data() + pos_, lit.data(), lit.size()) == 0;
  }

  bool Consume(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool Consume(std::string_view lit) {
    if (!StartsWith(lit)) return false;
    pos_ += lit.size();
    return true;
  }
  // Moves back to `pos`, so an error points at the start of the offending field.
  void Reset(std::size_t pos) { pos_ = std::min(pos, text_.size()); }
  void SkipBlanks() {
    while (pos_ < text_.size() && IsBlank(text_[pos_])) ++pos_;
  }

  // 1..max_digits hex digits; stops after max_digits so the caller sees what follows.
  std::optional<uint32_t> Hex(std::size_t max_digits) {
    uint32_t value = 0;
    std::size_t n = 0;
    while (n < max_digits && pos_ < text_.size() && IsHex(text_[pos_])) {
      value = (value << 4) | HexValue(text_[pos_]);
      ++pos_;
      ++n;
    }
    if (n == 0) return std::nullopt;
    return value;
  }

  // A run of decimal digits. More than max_digits, or a value above max, is kTooLarge.
  Number Decimal(std::size_t max_digits, uint64_t max) {
    Number out;
    uint64_t value = 0;
    std::size_t n = 0;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) {
      if (n < max_digits) value = value * 10 + static_cast<uint64_t>(text_[pos_] - '0');
      ++pos_;
      ++n;
    }
    if (n == 0) return out;
    if (n > max_digits || value > max) {
      out.status = NumberStatus::kTooLarge;
      return out;
    }
    out.status = NumberStatus::kOk;
    out.value = static_cast<uint32_t>(value);
    return out;
  }

  // The rest of the current line, without the line break; the cursor moves to its end.
  std::string_view RestOfLine() {
    // Two memchr scans instead of a byte loop: details run to a hundred bytes and more.
    std::string_view rest = text_.substr(pos_);
    rest = rest.substr(0, rest.find('\n'));
    rest = rest.substr(0, rest.find('\r'));
    pos_ += rest.size();
    return rest;
  }

 private:
  std::string_view text_;
  std::size_t pos_;
};

// Length of the well-formed UTF-8 sequence at in[i] (RFC 3629 table: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
std::size_t Utf8SequenceLength(std::string_view in, std::size_t i) {
  auto byte = [&](std::size_t k) -> unsigned { return static_cast<unsigned char>(in[k]); };
  auto cont = [&](std::size_t k, unsigned lo, unsigned hi) {
    return k < in.size() && byte(k) >= lo && byte(k) <= hi;
  };
  const unsigned b0 = byte(i);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1, 0x80, 0xBF) ? 2 : 0;
  if (b0 == 0xE0) return cont(i + 1, 0xA0, 0xBF) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    return cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  }
  if (b0 == 0xED) return cont(i + 1, 0x80, 0x9F) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  if (b0 == 0xF0) {
    return cont(i + 1, 0x90, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  if (b0 >= 0xF1 && b0 <= 0xF3) {
    return cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  if (b0 == 0xF4) {
    return cont(i + 1, 0x80, 0x8F) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// The end of the run of printable ASCII that starts at in[i]; 16 bytes at a time where SSE2 is
// there.
std::size_t PlainAsciiRun(std::string_view in, std::size_t i) {
#if defined(GNS_KERNEL_LINE_SSE2)
  const __m128i space = _mm_set1_epi8(0x20);
  const __m128i del = _mm_set1_epi8(0x7F);
  for (; i + 16 <= in.size(); i += 16) {
    const __m128i chunk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data() + i));
    // Signed compare: bytes 0x80..0xFF are negative, so below ' ' too.
    const __m128i other = _mm_or_si128(_mm_cmplt_epi8(chunk, space), _mm_cmpeq_epi8(chunk, del));
    if (const int mask = _mm_movemask_epi8(other); mask != 0) return i + static_cast<std::size_t>(__builtin_ctz(mask));
  }
#endif
  while (i < in.size() && IsPlainAscii(in[i])) ++i;
  return i;
}

// Copies `in` as printable, valid UTF-8 of at most `cap` bytes: the strings end up in
// protobuf string fields (which must be UTF-8), JSON and log lines. Invalid bytes and
// control characters become '?', tabs become spaces. Returns true when text was cut.
bool CopySanitized(std::string& out, std::string_view in, std::size_t cap) {
  out.clear();
  out.reserve(std::min(in.size(), cap));
  std::size_t i = 0;
  while (i < in.size()) {
    // Printable ASCII (nearly all of a real line) is kept as it is: copy the whole run at
    // once, up to the cap, instead of appending byte by byte.
    const std::size_t run = PlainAsciiRun(in, i);
    if (run > i) {
      const std::size_t room = cap - out.size();
      if (run - i > room) {
        out.append(in.data() + i, room);
        return true;
      }
      out.append(in.data() + i, run - i);
      i = run;
      continue;
    }
    std::size_t len = Utf8SequenceLength(in, i);
    std::string_view piece;
    if (len == 0) {
      piece = "?";
      len = 1;
    } else if (len == 1) {
      const auto c = static_cast<unsigned char>(in[i]);
      if (c == '\t') {
        piece = " ";
      } else if (c < 0x20 || c == 0x7F) {
        piece = "?";
      } else {
        piece = in.substr(i, 1);
      }
    } else if (len == 2 && static_cast<unsigned char>(in[i]) == 0xC2 &&
               static_cast<unsigned char>(in[i + 1]) < 0xA0) {
      piece = "?";  // C1 control characters (U+0080..U+009F)
    } else {
      piece = in.substr(i, len);
    }
    if (out.size() + piece.size() > cap) return true;
    out.append(piece);
    i += len;
  }
  return false;
}

std::string_view TrimTrailingBlanks(std::string_view s) {
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

// True when `lit` is at text[at]. With `lit` a constant the compare is inlined.
bool HasAt(std::string_view text, std::size_t at, std::string_view lit) {
  return text.size() - at >= lit.size() && std::memcmp(text.data() + at, lit.data(), lit.size()) == 0;
}

// Calls visit(i) for every i, in increasing order, where text[i] is 'N', 'G' or 'S' (how "NVRM",
// "GPU reset " and "SXid" start), until visit returns true. One pass over the message, 16 bytes at a
// time where SSE2 is there: what decides that nearly every kernel line is unrelated.
template <typename Visit>
void ForEachMarkerStart(std::string_view text, Visit&& visit) {
  const char* const p = text.data();
  const std::size_t n = text.size();
  std::size_t i = 0;
#if defined(GNS_KERNEL_LINE_SSE2)
  if (n >= 16) {
    const __m128i n_byte = _mm_set1_epi8('N');
    const __m128i g_byte = _mm_set1_epi8('G');
    const __m128i s_byte = _mm_set1_epi8('S');
    auto candidates = [&](std::size_t at) {
      const __m128i chunk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
      const __m128i n_or_g = _mm_or_si128(_mm_cmpeq_epi8(chunk, n_byte), _mm_cmpeq_epi8(chunk, g_byte));
      return static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(n_or_g, _mm_cmpeq_epi8(chunk, s_byte))));
    };
    auto each = [&](std::size_t base, unsigned mask) {
      for (; mask != 0; mask &= mask - 1) {
        if (visit(base + static_cast<std::size_t>(__builtin_ctz(mask)))) return true;
      }
      return false;
    };
    for (; i + 16 <= n; i += 16) {
      if (each(i, candidates(i))) return;
    }
    if (i < n) {  // the last 16 bytes again, without the ones already visited
      const std::size_t base = n - 16;
      each(base, candidates(base) & ~((1u << (i - base)) - 1));
    }
    return;
  }
#endif
  for (; i < n; ++i) {
    if ((p[i] == 'N' || p[i] == 'G' || p[i] == 'S') && visit(i)) return;
  }
}

// Every result is copied from this constant and then given its alternative in place: GCC
// builds a std::variant of any alternative by first zeroing all of it (over a hundred bytes
// here, with a rep stos that costs more than scanning an unrelated line, and stalls the next
// read of the index), while the copy of a monostate variant writes only the index.
constinit const ParsedLine kUnrelated{};

ParsedLine Unrelated() { return kUnrelated; }

// A ParsedLine holding `line`. One return of one named object, so it is built in the caller's
// result (and every parser returns such prvalues, never a named ParsedLine, which would be
// moved through std::visit).
template <typename Line>
ParsedLine Parsed(Line&& line) {
  ParsedLine out = kUnrelated;
  out.payload.emplace<std::decay_t<Line>>(std::forward<Line>(line));
  return out;
}

ParsedLine Malformed(LineKind attempted, std::size_t offset, std::string_view expected) {
  return Parsed(MalformedLine{attempted, offset, expected});
}

// "domain:bus:device[.function]" at the cursor. On failure returns what was expected.
std::optional<PciAddress> PciAt(Cursor& c, std::string_view& expected) {
  PciAddress pci;
  auto domain = c.Hex(8);
  if (!domain) {
    expected = "expected a hex PCI domain";
    return std::nullopt;
  }
  if (!c.Consume(':')) {
    expected = "expected ':' after the PCI domain";
    return std::nullopt;
  }
  auto bus = c.Hex(2);
  if (!bus) {
    expected = "expected a hex PCI bus";
    return std::nullopt;
  }
  if (!c.Consume(':')) {
    expected = "expected ':' after the PCI bus";
    return std::nullopt;
  }
  const std::size_t device_start = c.pos();
  auto device = c.Hex(2);
  if (!device || *device > 0x1F) {
    c.Reset(device_start);
    expected = "expected a hex PCI device number (00-1f)";
    return std::nullopt;
  }
  pci.domain = *domain;
  pci.bus = static_cast<uint8_t>(*bus);
  pci.device = static_cast<uint8_t>(*device);
  if (c.Consume('.')) {
    const std::size_t function_start = c.pos();
    auto function = c.Hex(1);
    if (!function || *function > 7) {
      c.Reset(function_start);
      expected = "expected a PCI function (0-7) after '.'";
      return std::nullopt;
    }
    pci.function = static_cast<uint8_t>(*function);
    pci.has_function = true;
  }
  return pci;
}

// "GPU-" followed by hex digits and dashes, ending at a blank, ',' or the end of the line.
std::optional<std::string> UuidAt(Cursor& c, std::string_view text) {
  const std::size_t start = c.pos();
  if (!c.Consume(kUuidPrefix)) return std::nullopt;
  std::size_t n = 0;
  while (c.pos() < text.size() && (IsHex(text[c.pos()]) || text[c.pos()] == '-')) {
    c.Consume(text[c.pos()]);
    ++n;
  }
  const bool ends_well = c.AtLineEnd() || IsBlank(text[c.pos()]) || c.Peek(',');
  if (n == 0 || c.pos() - start > kMaxUuidBytes || !ends_well) {
    c.Reset(start);
    return std::nullopt;
  }
  return std::string(text.substr(start, c.pos() - start));
}

ParsedLine ParseXid(std::string_view msg, std::size_t marker) {
  Cursor c(msg, marker + kXidMarker.size());
  auto fail = [&](std::string_view expected) { return Malformed(LineKind::kXid, c.pos(), expected); };

  c.SkipBlanks();
  if (!c.Consume('(')) return fail("expected '(' after 'NVRM: Xid'");
  c.Consume("PCI:");  // very old drivers print "(0000:03:00)"
  std::string_view expected;
  auto pci = PciAt(c, expected);
  if (!pci) return fail(expected);

  XidLine x;
  x.pci = *pci;
  if (c.Consume(" GPU-I:")) {
    const std::size_t start = c.pos();
    Number n = c.Decimal(5, std::numeric_limits<uint16_t>::max());
    if (n.status != NumberStatus::kOk) c.Reset(start);
    if (n.status != NumberStatus::kOk) return fail("expected a GPU instance number after 'GPU-I:'");
    x.gpu_instance = n.value;
  }
  if (c.Consume(" GPU-CI:")) {
    const std::size_t start = c.pos();
    Number n = c.Decimal(5, std::numeric_limits<uint16_t>::max());
    if (n.status != NumberStatus::kOk) {
      c.Reset(start);
      return fail("expected a compute instance number after 'GPU-CI:'");
    }
    x.compute_instance = n.value;
  }
  if (!c.Consume(')')) return fail("expected ')' after the PCI address");
  if (!c.Consume(':')) return fail("expected ':' after ')'");
  c.SkipBlanks();

  const std::size_t xid_start = c.pos();
  Number xid = c.Decimal(10, std::numeric_limits<uint32_t>::max());
  if (xid.status != NumberStatus::kOk) c.Reset(xid_start);
  if (xid.status == NumberStatus::kMissing) return fail("expected the XID number");
  if (xid.status == NumberStatus::kTooLarge) return fail("XID number does not fit in 32 bits");
  x.xid = xid.value;

  if (!c.AtLineEnd()) {
    if (!c.Consume(',')) return fail("expected ',' after the XID number");
    c.SkipBlanks();
    if (c.Consume("pid=")) {
      if (!c.Consume(kUnknownQuoted) && !c.Consume(kUnknown)) {
        const std::size_t start = c.pos();
        Number pid = c.Decimal(10, std::numeric_limits<uint32_t>::max());
        if (pid.status != NumberStatus::kOk) {
          c.Reset(start);
          return fail("expected a process id or '<unknown>' after 'pid='");
        }
        x.pid = pid.value;
      }
      if (!c.AtLineEnd()) {
        if (!c.Consume(',')) return fail("expected ',' after the pid");
        c.SkipBlanks();
      }
    }
    if (c.Consume("name=")) {
      // The driver prints the name unescaped and follows it with ", "; a name that itself
      // contains ", " is cut there and the remainder lands in the detail.
      std::string_view rest = c.RestOfLine();
      const std::size_t comma = rest.find(", ");
      std::string_view name = rest.substr(0, comma);
      name = TrimTrailingBlanks(name);
      if (name != kUnknown) x.raw_process_name = name;
      std::string_view detail = comma == std::string_view::npos ? std::string_view{}
                                                                 : rest.substr(comma + 2);
      while (!detail.empty() && IsBlank(detail.front())) detail.remove_prefix(1);
      x.raw_detail = TrimTrailingBlanks(detail);
    } else {
      x.raw_detail = TrimTrailingBlanks(c.RestOfLine());
    }
  }
  return Parsed(std::move(x));
}

ParsedLine ParseGpuUuid(std::string_view msg, std::size_t marker) {
  Cursor c(msg, marker + kGpuAtMarker.size());
  auto fail = [&](std::string_view expected) {
    return Malformed(LineKind::kGpuUuid, c.pos(), expected);
  };
  std::string_view expected;
  auto pci = PciAt(c, expected);
  if (!pci) return fail(expected);
  if (!c.Consume(':')) return fail("expected ':' after the PCI address");
  c.SkipBlanks();
  auto uuid = UuidAt(c, msg);
  if (!uuid) return fail("expected 'GPU-' followed by hex digits and dashes");
  return Parsed(GpuUuidLine{*pci, std::move(*uuid)});
}

ParsedLine ParseFallenOffBus(std::string_view msg) {
  FallenOffBusLine f;
  std::string_view unused;
  // Probe-time form: "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed
  // in this system has\nNVRM: fallen off the bus and is not responding to commands."
  if (const std::size_t p = msg.find(kTheGpuMarker); p != std::string_view::npos) {
    Cursor c(msg, p + kTheGpuMarker.size());
    if (auto pci = PciAt(c, unused)) f.pci = *pci;
  } else {
    // Runtime form (NV_DEV_PRINTF): "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    for (std::size_t p = msg.find(kDevPrintfMarker); p != std::string_view::npos;
         p = msg.find(kDevPrintfMarker, p + 1)) {
      Cursor c(msg, p + kDevPrintfMarker.size());
      auto pci = PciAt(c, unused);
      if (pci && c.Consume(':')) {
        f.pci = *pci;
        break;
      }
    }
  }
  return Parsed(f);
}

// "nvidia-nvswitchN: SXid (PCI:dddd:bb:dd.f): NNNNN, <severity>, Link L <text>", or without the
// link ("…: NNNNN, Fatal, Unexpected PRI error": an error of the switch itself). <severity> is the
// driver's "Fatal", "Non-fatal" or "Correctable" (the last is non-fatal). The companion lines of
// one report ("…: NNNNN, Severity …", "…: NNNNN, Data {…}"), reports without a severity word and
// any form this parser does not know after the number are unrelated: only a broken address,
// number or link is malformed.
ParsedLine ParseSxid(std::string_view msg, std::size_t marker) {
  Cursor c(msg, marker + kSxidMarker.size());
  auto fail = [&](std::string_view expected) { return Malformed(LineKind::kSxid, c.pos(), expected); };
  std::string_view expected;
  auto pci = PciAt(c, expected);
  if (!pci) return fail(expected);
  if (!c.Consume(')')) return fail("expected ')' after the PCI address");
  if (!c.Consume(':')) return fail("expected ':' after ')'");
  c.SkipBlanks();
  const std::size_t number_start = c.pos();
  Number sxid = c.Decimal(10, std::numeric_limits<uint32_t>::max());
  if (sxid.status != NumberStatus::kOk) c.Reset(number_start);
  if (sxid.status == NumberStatus::kMissing) return fail("expected the SXid number");
  if (sxid.status == NumberStatus::kTooLarge) return fail("SXid number does not fit in 32 bits");

  SxidLine line;
  if (c.Consume(", Fatal, ")) {
    line.fatal = true;
  } else if (!c.Consume(", Non-fatal, ") && !c.Consume(", Correctable, ")) {
    return Unrelated();
  }
  if (c.Consume("Link ")) {
    const std::size_t link_start = c.pos();
    Number link = c.Decimal(5, std::numeric_limits<uint16_t>::max());
    if (link.status != NumberStatus::kOk) {
      c.Reset(link_start);
      return fail("expected the NVSwitch link number after 'Link '");
    }
    line.link = static_cast<uint32_t>(link.value);
  }
  line.pci = *pci;
  line.sxid = sxid.value;
  c.SkipBlanks();
  std::string_view detail = c.RestOfLine();
  while (!detail.empty() && IsBlank(detail.back())) detail.remove_suffix(1);
  line.raw_detail = detail;

  // "nvidia-nvswitchN: " just before the marker, where the message has it.
  const std::size_t prefix = msg.rfind(kNvSwitchPrefix, marker);
  if (prefix != std::string_view::npos) {
    Cursor n(msg, prefix + kNvSwitchPrefix.size());
    Number index = n.Decimal(5, std::numeric_limits<uint16_t>::max());
    if (index.status == NumberStatus::kOk && n.Consume(": ") && n.pos() == marker) line.nvswitch = index.value;
  }
  return Parsed(std::move(line));
}

ParsedLine ParseResetAck(std::string_view msg, std::size_t marker, std::size_t marker_size, bool started = false) {
  Cursor c(msg, marker + marker_size);
  auto fail = [&](std::string_view expected) {
    return Malformed(LineKind::kResetAck, c.pos(), expected);
  };
  auto uuid = UuidAt(c, msg);
  if (!uuid) return fail("expected 'GPU-' followed by hex digits and dashes");
  ResetAckLine ack;
  ack.uuid = std::move(*uuid);
  ack.started = started;
  if (started) return Parsed(std::move(ack));
  if (c.Consume(", success: ")) {
    if (c.Consume("true")) {
      ack.success = true;
    } else if (c.Consume("false")) {
      ack.success = false;
    } else {
      return fail("expected 'true' or 'false' after 'success: '");
    }
  }
  return Parsed(std::move(ack));
}

}  // namespace

std::string_view LineKindName(LineKind kind) noexcept {
  switch (kind) {
    case LineKind::kUnrelated: return "unrelated";
    case LineKind::kXid: return "Xid";
    case LineKind::kGpuUuid: return "GPU UUID";
    case LineKind::kFallenOffBus: return "fallen off the bus";
    case LineKind::kResetAck: return "GPU reset acknowledgement";
    case LineKind::kMalformed: return "malformed";
    case LineKind::kSxid: return "SXid";
  }
  return "unknown";
}

std::string SanitizedText(std::string_view text, std::size_t cap, bool* truncated) {
  std::string out;
  const bool cut = CopySanitized(out, text, cap);
  if (truncated != nullptr) *truncated = cut;
  return out;
}

std::optional<std::string> XidLine::process_name() const {
  if (!raw_process_name) return std::nullopt;
  return SanitizedText(*raw_process_name, kMaxProcessNameBytes);
}

std::string XidLine::detail() const { return SanitizedText(raw_detail, kMaxDetailBytes); }

std::string SxidLine::detail() const { return SanitizedText(raw_detail, kMaxDetailBytes); }

bool XidLine::detail_truncated() const {
  bool truncated = false;
  (void)SanitizedText(raw_detail, kMaxDetailBytes, &truncated);
  return truncated;
}

std::string MalformedLine::Reason() const {
  std::string out(LineKindName(attempted));
  out += " line, byte ";
  out += std::to_string(offset);
  out += ": ";
  out += expected;
  return out;
}

LineKind ParsedLine::kind() const noexcept {
  // The order of the variant's alternatives: monostate, XidLine, GpuUuidLine, FallenOffBusLine,
  // ResetAckLine, MalformedLine, SxidLine.
  static constexpr LineKind kByIndex[] = {LineKind::kUnrelated, LineKind::kXid,       LineKind::kGpuUuid,
                                          LineKind::kFallenOffBus, LineKind::kResetAck, LineKind::kMalformed,
                                          LineKind::kSxid};
  static_assert(std::size(kByIndex) == std::variant_size_v<decltype(payload)>);
  const std::size_t index = payload.index();
  return index < std::size(kByIndex) ? kByIndex[index] : LineKind::kUnrelated;  // npos: valueless
}

ParsedLine ParseKernelLine(std::string_view message) noexcept {
  // Nearly every kernel line is unrelated. Every marker starts with "NVRM", "SXid" or
  // "GPU reset ", so one pass over the 'N's, 'S's and 'G's of the message finds the first valid
  // "NVRM: Xid" (it wins wherever it is), the first "SXid (PCI:", the first "NVRM: GPU at PCI:"
  // and the first "GPU reset ".
  constexpr std::size_t npos = std::string_view::npos;
  bool nvrm = false;
  std::size_t xid = npos;
  std::size_t gpu_at = npos;
  std::size_t reset = npos;
  std::size_t sxid = npos;
  ForEachMarkerStart(message, [&](std::size_t at) {
    if (message[at] == 'S') {
      if (sxid == npos && HasAt(message, at, kSxidMarker)) sxid = at;
      return false;
    }
    if (message[at] == 'N') {
      if (!HasAt(message, at, kNvrm)) return false;
      nvrm = true;
      if (HasAt(message, at, kXidMarker)) {
        // "NVRM: Xid" must be a word of its own ("NVRM: Xids …" is something else).
        const std::size_t next = at + kXidMarker.size();
        if (next >= message.size() || message[next] == ' ' || message[next] == '(') {
          xid = at;
          return true;
        }
      } else if (gpu_at == npos && HasAt(message, at, kGpuAtMarker)) {
        gpu_at = at;
      }
    } else if (reset == npos && HasAt(message, at, kResetCommon)) {
      reset = at;
    }
    return false;
  });
  if (xid != npos) return ParseXid(message, xid);
  if (sxid != npos) return ParseSxid(message, sxid);
  if (gpu_at != npos) return ParseGpuUuid(message, gpu_at);
  if (nvrm && message.find(kFallenText) != npos) return ParseFallenOffBus(message);
  if (reset != npos) {
    if (const std::size_t p = message.find(kResetExecuted, reset); p != npos) {
      return ParseResetAck(message, p, kResetExecuted.size());
    }
    if (const std::size_t p = message.find(kResetOccurred, reset); p != npos) {
      return ParseResetAck(message, p, kResetOccurred.size());
    }
    if (const std::size_t p = message.find(kResetStarted, reset); p != npos) {
      return ParseResetAck(message, p, kResetStarted.size(), true);
    }
  }
  return Unrelated();
}

}  // namespace gns::gpu_health
