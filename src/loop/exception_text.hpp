#pragma once
// What an exception_ptr holds, as text for a log line or a module failure: a coroutine or pool
// job that ended with an exception hands it over as a pointer, and every such handler needs the
// same three-way catch (std::exception, anything else, none). A handler that caught only
// std::exception would let anything else escape from the loop's completion handler.

#include <exception>
#include <string>

namespace gns {

inline std::string DescribeException(const std::exception_ptr& error) {
  if (!error) return "no exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace gns
