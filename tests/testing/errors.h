// error_of(f): the message of the dpe::Error that f() throws, or "(no error)". Tests check messages name
// the offending values: EXPECT_NE(error_of([&] { x.view({7}); }).find("invalid for 6 elements"), npos).
#pragma once

#include <string>

#include "core/error.h"

namespace dpe::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace dpe::testing
