#include "tools/dpe/cli_util.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/errors.h"

namespace dpe::tool {
namespace {

using dpe::testing::error_of;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ParseDeviceList, GoodLists) {
  EXPECT_EQ(parse_device_list("cpu:0,cpu:1"), (std::vector<Device>{Device::cpu(0), Device::cpu(1)}));
  EXPECT_EQ(parse_device_list("cpu"), (std::vector<Device>{Device::cpu(0)}));
  EXPECT_EQ(parse_device_list("cuda:3"), (std::vector<Device>{Device{DeviceKind::CUDA, 3}}));
  // Duplicates and devices that do not exist are not the parser's business (DataParallel names them).
  EXPECT_EQ(parse_device_list("cpu:1,cpu:1").size(), 2u);
  EXPECT_EQ(parse_device_list("cpu:999").size(), 1u);
}

TEST(ParseDeviceList, EmptyListsAndItemsAreErrorsNamingThePosition) {
  EXPECT_TRUE(has(error_of([] { parse_device_list(""); }), "expected at least one device")) << error_of([] { parse_device_list(""); });
  const std::string middle = error_of([] { parse_device_list("cpu:0,,cpu:1"); });
  EXPECT_TRUE(has(middle, "'cpu:0,,cpu:1': item 2 is empty")) << middle;
  const std::string trailing = error_of([] { parse_device_list("cpu:0,"); });
  EXPECT_TRUE(has(trailing, "'cpu:0,': item 2 is empty")) << trailing;
  const std::string leading = error_of([] { parse_device_list(",cpu:0"); });
  EXPECT_TRUE(has(leading, "item 1 is empty")) << leading;
  EXPECT_TRUE(has(error_of([] { parse_device_list(","); }), "item 1 is empty"));
  const std::string bad = error_of([] { parse_device_list("cpu:0,gpu:0"); });
  EXPECT_TRUE(has(bad, "item 2: invalid device string 'gpu:0'")) << bad;
  EXPECT_TRUE(has(error_of([] { parse_device_list("cpu:0, cpu:1"); }), "item 2: invalid device string ' cpu:1'"));
  EXPECT_TRUE(has(error_of([] { parse_device_list("cpu:-1"); }), "item 1"));
  const std::string option = error_of([] { parse_device_option("--device-ids", "cpu:0,"); });
  EXPECT_EQ(option.rfind("--device-ids 'cpu:0,': item 2 is empty", 0), 0u) << option;
}

TEST(CheckDeviceIds, ExistingDistinctDevicesOfOneKind) {
  check_device_ids("--device-ids", {Device::cpu(0), Device::cpu(1)});
  const std::string twice = error_of([] { check_device_ids("--device-ids", {Device::cpu(0), Device::cpu(1), Device::cpu(0)}); });
  EXPECT_TRUE(has(twice, "--device-ids lists cpu:0 more than once (items 1 and 3); expected distinct devices")) << twice;
  const std::string many = error_of([] { check_device_ids("--device-ids", std::vector<Device>(1025, Device::cpu(0))); });
  EXPECT_TRUE(has(many, "--device-ids lists 1025 devices; expected at most 1024")) << many;
  const std::string missing = error_of([] { check_device_ids("--output-device", {Device::cpu(100000)}); });
  EXPECT_EQ(missing.rfind("--output-device: cpu:100000 does not exist", 0), 0u) << missing;
}

TEST(ParseInt, RangesAndMessages) {
  EXPECT_EQ(parse_int("--epochs", "7", 1, 1000000), 7);
  EXPECT_EQ(parse_int("--epochs", "+7", 1, 1000000), 7);
  EXPECT_EQ(parse_int("--epochs", "007", 1, 1000000), 7) << "decimal, not octal";
  EXPECT_EQ(parse_int("--x", "-3", -5, 5), -3);
  EXPECT_EQ(parse_int("--x", "1000000", 1, 1000000), 1000000);
  const std::string zero = error_of([] { parse_int("--batch-size", "0", 1, int64_t{1} << 31); });
  EXPECT_TRUE(has(zero, "--batch-size 0: expected an integer in [1, 2^31]")) << zero;
  for (const char* text : {"99999999999999999999999", "-99999999999999999999999", "abc", "1.5", "1e3", "0x10",
                           " 5", "5 ", "", "+", "-", "+-5", "++5", "5K", "inf"}) {
    const std::string e = error_of([&] { parse_int("--epochs", text, 1, 1000000); });
    EXPECT_TRUE(has(e, "expected an integer in [1, 1000000]")) << text << ": " << e;
    EXPECT_TRUE(has(e, std::string("--epochs ") + (*text ? text : "''"))) << e;
  }
  EXPECT_TRUE(has(error_of([] { parse_int("--limit", "-5", 1, 100); }), "--limit -5: expected an integer in [1, 100]"));
}

TEST(ParseInt, SizeSuffixesArePowersOf1024) {
  EXPECT_EQ(parse_int("-b", "4096", 1, int64_t{1} << 32, true), 4096);
  EXPECT_EQ(parse_int("-b", "1K", 1, int64_t{1} << 32, true), 1024);
  EXPECT_EQ(parse_int("-b", "64M", 1, int64_t{1} << 32, true), 64 << 20);
  EXPECT_EQ(parse_int("-b", "64mb", 1, int64_t{1} << 32, true), 64 << 20);
  EXPECT_EQ(parse_int("-b", "2GiB", 1, int64_t{1} << 32, true), int64_t{2} << 30);
  for (const char* text : {"8G", "1X", "K", "1KK", "1.5K", "99999999999T", "1 K", "-1K"}) {
    const std::string e = error_of([&] { parse_int("--max-bytes", text, 1, int64_t{1} << 32, true); });
    EXPECT_TRUE(has(e, "expected an integer in [1, 2^32] (a K, M, G or T suffix")) << text << ": " << e;
  }
}

TEST(ParseReal, FiniteAndBounded) {
  EXPECT_EQ(parse_real("--lr", "0.05", 0, true), 0.05);
  EXPECT_EQ(parse_real("--lr", "1e-3", 0, true), 1e-3);
  EXPECT_EQ(parse_real("--momentum", "0", 0, false), 0.0);
  for (const char* text : {"inf", "-inf", "nan", "NaN", "infinity", "1e400", "0", "-0.1", "abc", "", "0x1p3",
                           "1,5", "0.05 "}) {
    const std::string e = error_of([&] { parse_real("--lr", text, 0, true); });
    EXPECT_TRUE(has(e, "expected a finite number > 0")) << text << ": " << e;
  }
  EXPECT_TRUE(has(error_of([] { parse_real("--weight-decay", "-1", 0, false); }),
                  "--weight-decay -1: expected a finite number >= 0"));
}

TEST(ParseUint64, Seeds) {
  EXPECT_EQ(parse_uint64("--seed", "18446744073709551615"), UINT64_MAX);
  for (const char* text : {"-1", "18446744073709551616", "x", ""}) {
    EXPECT_TRUE(has(error_of([&] { parse_uint64("--seed", text); }), "expected an integer in [0, 2^64-1]")) << text;
  }
}

// The options are registered with CLI11 and parsed through it: a bad value is a dpe::Error out of parse.
TEST(NumericOptions, ParseThroughCli11) {
  CLI::App app;
  int64_t batch = 128;
  int factor = 4;
  double lr = 0.05;
  uint64_t seed = 0;
  add_int_option(app, "--batch-size", batch, "batch", 1, int64_t{1} << 31);
  add_int_option(app, "-f,--factor", factor, "factor", 2, 1024);
  add_real_option(app, "--lr", lr, "lr", 0, true);
  add_seed_option(app, "--seed", seed, "seed");
  app.parse("--batch-size 64 --lr 0.5 --seed 9 -f 7", false);
  EXPECT_EQ(batch, 64);
  EXPECT_EQ(factor, 7);
  EXPECT_EQ(lr, 0.5);
  EXPECT_EQ(seed, 9u);
  CLI::App bad;
  add_int_option(bad, "-f,--factor", factor, "factor", 2, 1024);
  const std::string e = error_of([&] { bad.parse("-f 1", false); });
  EXPECT_TRUE(has(e, "--factor 1: expected an integer in [2, 1024]")) << e;
  EXPECT_TRUE(has(app.help(), "INT:[1, 2^31]=128")) << app.help();
  EXPECT_TRUE(has(app.help(), "FLOAT:(0, inf)=0.05")) << app.help();  // the defaults at registration
}

// Regression: CLI11's delimiter dropped empty items of --modes / --ops / --pytorch-configs without a word.
TEST(NameListOptions, EveryItemNonEmptyAndKnown) {
  const std::vector<std::string> modes = {"single", "dp", "ddp"};
  EXPECT_EQ(parse_name_list("--modes", "ddp,single", modes), (std::vector<std::string>{"ddp", "single"}));
  EXPECT_EQ(parse_name_list("--configs", "anything,else", {}), (std::vector<std::string>{"anything", "else"}));
  EXPECT_TRUE(has(error_of([&] { parse_name_list("--modes", "single,,dp", modes); }),
                  "--modes 'single,,dp': item 2 is empty"));
  EXPECT_TRUE(has(error_of([&] { parse_name_list("--modes", "dp,", modes); }), "--modes 'dp,': item 2 is empty"));
  EXPECT_TRUE(has(error_of([&] { parse_name_list("--modes", "", modes); }),
                  "--modes '': expected at least one of single,dp,ddp"));
  EXPECT_TRUE(has(error_of([&] { parse_name_list("--modes", "dp,frob", modes); }),
                  "--modes 'dp,frob': item 2 'frob' is not one of single,dp,ddp"));
  CLI::App app;
  std::vector<std::string> chosen = {"single"};
  add_name_list_option(app, "--modes", chosen, "modes", modes);
  EXPECT_TRUE(has(app.help(), "=single")) << app.help();
  app.parse("--modes dp,ddp", false);
  EXPECT_EQ(chosen, (std::vector<std::string>{"dp", "ddp"}));
  EXPECT_TRUE(has(error_of([&] { app.parse("--modes dp,,ddp", false); }), "item 2 is empty"));
}

}  // namespace
}  // namespace dpe::tool
