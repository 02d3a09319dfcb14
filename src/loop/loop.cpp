// Out-of-line pieces of loop.hpp.
#include "loop/loop.hpp"

#include <cstdio>

namespace gns::detail {

void OffLoopAbort(const char* file, int line) {
  std::fprintf(stderr, "%s:%d: loop-thread state touched from another thread\n", file, line);
  std::abort();
}

}  // namespace gns::detail
