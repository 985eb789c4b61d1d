#include "core/stream.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"

namespace dpe {
namespace {

TEST(StreamTest, CpuEventsTimeHostWork) {
  Event start, stop;
  start.record(Device::cpu(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.record(Device::cpu(0));
  stop.synchronize();
  stop.block(Device::cpu(1));  // CPU work is complete when recorded: nothing to wait for
  double ms = start.elapsed_ms(stop);
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 5000.0);
  synchronize(Device::cpu(0));
}

TEST(StreamTest, UnrecordedEventsAndMissingDevicesAreErrors) {
  Event e;
  EXPECT_THROW(e.synchronize(), Error);
  EXPECT_THROW(e.block(Device::cpu(0)), Error);
  EXPECT_THROW(e.record(Device::cpu(1000)), Error);
  if (!cuda_available()) {
    EXPECT_THROW(synchronize(Device::cuda(0)), Error);
  }
}

}  // namespace
}  // namespace dpe
