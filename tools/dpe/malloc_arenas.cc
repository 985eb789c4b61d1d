#include "tools/dpe/malloc_arenas.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

namespace dpe::tool {

bool one_malloc_arena_under_address_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr || (tunables != nullptr && std::strstr(tunables, "arena_max"))) {
    return false;
  }
  return mallopt(M_ARENA_MAX, 1) == 1;
}

}  // namespace dpe::tool
