#pragma once
// Well-formed UTF-8 without control characters: what the kernel-line parser promises for every
// string it returns. Header-only so the libFuzzer target (built by clang alone) shares it with
// the unit test.

#include <cstddef>
#include <string_view>

namespace gns::test {

inline bool PrintableUtf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F) return false;
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
    } else {
      return false;  // a continuation byte first, an overlong lead byte, or beyond U+10FFFF
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace gns::test
