// dispose(): a report emptied by it is destroyed without a single allocation (Note [A report's destructor
// allocates] in json_report.h), where the plain destructor allocates; as_printed keeps printf's digits.
#include "tools/dpe/json_report.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

// Every operator new of this test binary, counted (the replaceable global allocation functions).
std::atomic<long> allocations{0};

}  // namespace

void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace dpe::tool {
namespace {

JsonReport nested_report() {
  JsonReport epochs = JsonReport::array();
  for (int e = 1; e <= 3; ++e) epochs.push_back({{"epoch", e}, {"loss", 0.5 / e}, {"notes", {"a", "b"}}});
  return {{"model", "cnn"}, {"epochs", epochs}, {"auto", {{"chosen", "ddp"}, {"steps", {1, 2, 3}}}}};
}

// Allocations made while `report` is destroyed.
long allocations_destroying(JsonReport* report) {
  const long before = allocations.load();
  delete report;  // operator delete, not new: only the destructor's own allocations count
  return allocations.load() - before;
}

TEST(JsonReport, ThePlainDestructorAllocates) {
  // Not vacuous: without dispose, destroying the same report allocates (nlohmann's flattening stack).
  EXPECT_GT(allocations_destroying(new JsonReport(nested_report())), 0);
}

TEST(JsonReport, ADisposedReportIsDestroyedWithoutAllocating) {
  auto* report = new JsonReport(nested_report());
  const long before = allocations.load();
  dispose(*report);
  EXPECT_EQ(allocations.load() - before, 0) << "dispose itself allocated";
  EXPECT_TRUE(report->empty());
  EXPECT_EQ(allocations_destroying(report), 0);
}

TEST(JsonReport, DisposeOnExitRunsBeforeTheReportGoes) {
  long during_exit = -1;
  {
    JsonReport report = nested_report();
    const DisposeOnExit dispose_report(report);
    during_exit = allocations.load();
  }
  EXPECT_EQ(allocations.load() - during_exit, 0);
  JsonReport scalar = 3.5;
  dispose(scalar);  // scalars are left as they are
  EXPECT_EQ(scalar, 3.5);
}

TEST(JsonReport, AsPrintedKeepsThePrintedDigits) {
  EXPECT_EQ(as_printed("%.3f", 1.23456), 1.235);
  EXPECT_EQ(as_printed("%g", 0.1234567), 0.123457);
}

}  // namespace
}  // namespace dpe::tool
