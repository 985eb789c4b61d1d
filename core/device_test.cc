#include "core/device.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dpe {
namespace {

TEST(DeviceTest, ParsesAndPrints) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu(0));
  EXPECT_EQ(Device::parse("cpu:3"), Device::cpu(3));
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:12"), Device::cuda(12));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(Device::parse(Device::cpu(7).str()), Device::cpu(7));
}

TEST(DeviceTest, RejectsBadStringsNamingThem) {
  for (const char* bad : {"gpu:0", "cpu:", "cpu:-1", "cuda:x", "cuda:1:2", "", "CPU:0", "cpu:1x"}) {
    try {
      Device::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(DeviceTest, CpuDeviceCountIsConfigurable) {
  int before = num_cpu_devices();
  EXPECT_GE(before, 2);
  set_num_cpu_devices(5);
  EXPECT_EQ(num_cpu_devices(), 5);
  EXPECT_EQ(all_devices(DeviceKind::CPU).size(), 5u);
  EXPECT_NO_THROW(check_device_exists(Device::cpu(4)));
  try {
    check_device_exists(Device::cpu(5));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu:5 does not exist"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu:0..cpu:4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(set_num_cpu_devices(0), Error);
  set_num_cpu_devices(before);
}

TEST(DeviceTest, MissingCudaDeviceIsAClearError) {
  Device beyond = Device::cuda(cuda_device_count());
  try {
    check_device_exists(beyond);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(beyond.str() + " does not exist"), std::string::npos) << e.what();
  }
}

TEST(DeviceTest, OrderingAndHash) {
  EXPECT_LT(Device::cpu(1), Device::cuda(0));
  EXPECT_NE(std::hash<Device>()(Device::cpu(0)), std::hash<Device>()(Device::cuda(0)));
}

}  // namespace
}  // namespace dpe
