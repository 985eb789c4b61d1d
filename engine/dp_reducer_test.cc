// DP mode's reduction into the master in shares (Note [DP reduction in shares] in engine/dp_reducer.h):
// bit for bit the serial sum, every element added exactly once, the parameters it cannot take left to
// finish(), and a partner that fails or never comes is an error on the others, not a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/ops.h"
#include "engine/dp_reducer.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using std::chrono::milliseconds;
using testing::cpu_devices;
using testing::error_of;

// Parameters of `replicas` replicas, one per device: sizes chosen so that the shares' 64-byte boundaries fall
// inside tensors (1000 = 62.5 lines), at their ends and beyond small ones (3 elements: one worker takes all).
std::vector<std::vector<Tensor>> make_params(const std::vector<Device>& devices) {
  std::vector<std::vector<Tensor>> params;
  for (const Device& d : devices) {
    TensorOptions opts = TensorOptions().with_device(d).with_requires_grad(true);
    params.push_back({zeros({1000}, opts), zeros({3}, opts), zeros({16, 33}, opts), zeros({64}, opts)});
  }
  return params;
}

// Gives every parameter of every replica a gradient of random values (as a backward would).
void set_random_grads(const std::vector<std::vector<Tensor>>& params) {
  for (const auto& replica : params) {
    for (const Tensor& p : replica) p.set_grad(randn(p.shape(), TensorOptions().with_device(p.device())));
  }
}

// n CPU replicas of make_params' parameters and a reducer over them.
struct Replicas {
  Replicas(int n, milliseconds timeout)
      : devices(cpu_devices(n)), params(make_params(devices)), reducer(params, devices, 10 << 20, timeout) {}
  // A step over the first `used` replicas, after which every parameter of every replica has a random
  // gradient (reduce_in_shares and finish() then reduce them).
  void step(size_t used) {
    reducer.prepare(used);
    set_random_grads(params);
  }
  std::vector<Device> devices;
  std::vector<std::vector<Tensor>> params;
  DpReducer reducer;
};

// What the serial path computes: master + replica 1 + replica 2 + ..., in that order.
std::vector<Tensor> serial_sums(const std::vector<std::vector<Tensor>>& params) {
  std::vector<Tensor> sums;
  for (size_t p = 0; p < params[0].size(); ++p) {
    Tensor s = params[0][p].grad().clone();
    for (size_t r = 1; r < params.size(); ++r) s.add_(params[r][p].grad());
    sums.push_back(s);
  }
  return sums;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Runs reduce_share(r) on one thread per replica; returns each thread's error (error_of's "(no error)" when none).
std::vector<std::string> reduce_in_shares(DpReducer& reducer, size_t replicas, size_t skip = SIZE_MAX) {
  std::vector<std::string> errors(replicas);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < replicas; ++r) {
    if (r == skip) continue;
    threads.emplace_back([&, r] { errors[r] = error_of([&] { reducer.reduce_share(r); }); });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(DpReducerShares, EqualTheSerialSumBitForBit) {
  for (int n : {2, 3}) {
    Replicas replicas(n, milliseconds(60000));
    DpReducer& reducer = replicas.reducer;
    const std::vector<std::vector<Tensor>>& params = replicas.params;
    for (int step = 0; step < 2; ++step) {  // a second step reuses the barrier
      replicas.step(static_cast<size_t>(n));
      const std::vector<Tensor> want = serial_sums(params);
      for (const std::string& e : reduce_in_shares(reducer, static_cast<size_t>(n))) EXPECT_EQ(e, "(no error)");
      const TransferStats stats = reducer.finish();
      for (size_t p = 0; p < want.size(); ++p) {
        EXPECT_TRUE(same_bits(params[0][p].grad(), want[p])) << n << " devices, parameter " << p;
      }
      // Counted as the serial path counts: every replica's gradient but the master's crossed once.
      int64_t bytes = 0;
      for (const Tensor& p : params[1]) bytes += static_cast<int64_t>(p.nbytes());
      EXPECT_EQ(stats.bytes, (n - 1) * bytes);
      EXPECT_EQ(stats.transfers, (n - 1) * static_cast<int64_t>(params[0].size()));
      EXPECT_EQ(reducer.buckets_reduced_early(), static_cast<int64_t>(reducer.num_buckets()));
    }
  }
}

// A parameter some replica has no gradient for (it was not used there) is not in the shares; finish() adds
// it as the serial path does, the master's missing gradient counting as zeros.
TEST(DpReducerShares, MissingGradientsAreLeftToFinish) {
  Replicas replicas(2, milliseconds(60000));
  DpReducer& reducer = replicas.reducer;
  const std::vector<std::vector<Tensor>>& params = replicas.params;
  replicas.step(2);
  params[0][2].set_grad({});  // only replica 1 used parameter 2
  params[1][3].set_grad({});  // only the master used parameter 3
  const Tensor replica_grad = params[1][2].grad().clone(), master_grad = params[0][3].grad().clone();
  const Tensor sum0 = params[0][0].grad().clone().add_(params[1][0].grad());
  for (const std::string& e : reduce_in_shares(reducer, 2)) EXPECT_EQ(e, "(no error)");
  EXPECT_FALSE(params[0][2].grad().defined());  // the shares left it alone
  reducer.finish();
  EXPECT_TRUE(same_bits(params[0][0].grad(), sum0));
  EXPECT_TRUE(same_bits(params[0][2].grad(), replica_grad));  // 0 + replica 1's
  EXPECT_TRUE(same_bits(params[0][3].grad(), master_grad));   // unchanged
}

// A failed partner wakes the others with its reason; the next step's prepare() makes the barrier usable
// again.
TEST(DpReducerShares, AbortWakesThePartners) {
  Replicas replicas(3, milliseconds(60000));
  DpReducer& reducer = replicas.reducer;
  const std::vector<std::vector<Tensor>>& params = replicas.params;
  replicas.step(3);
  std::thread failing([&] {
    std::this_thread::sleep_for(milliseconds(50));
    reducer.abort_shares("replica 2 on cpu:2 failed: injected");
  });
  const std::vector<std::string> errors = reduce_in_shares(reducer, 3, /*skip=*/2);
  failing.join();
  for (size_t r : {0u, 1u}) {
    EXPECT_NE(errors[r].find("replica 2 on cpu:2 failed: injected"), std::string::npos) << errors[r];
  }
  reducer.finish();

  replicas.step(3);
  const std::vector<Tensor> want = serial_sums(params);
  for (const std::string& e : reduce_in_shares(reducer, 3)) EXPECT_EQ(e, "(no error)");
  reducer.finish();
  for (size_t p = 0; p < want.size(); ++p) EXPECT_TRUE(same_bits(params[0][p].grad(), want[p])) << p;
}

// A partner that never comes is a timeout naming it.
TEST(DpReducerShares, AMissingPartnerTimesOut) {
  Replicas replicas(2, milliseconds(200));
  replicas.step(2);
  const std::vector<std::string> errors = reduce_in_shares(replicas.reducer, 2, /*skip=*/1);
  EXPECT_NE(errors[0].find("timed out after 200 ms"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("cpu:1 (rank 1)"), std::string::npos) << errors[0];
  replicas.reducer.finish();
}

// Not every replica used this step (a batch smaller than the device count): the hooks' path, no shares.
TEST(DpReducerShares, OnlyWhenEveryReplicaIsUsed) {
  Replicas replicas(3, milliseconds(200));
  DpReducer& reducer = replicas.reducer;
  const std::vector<std::vector<Tensor>>& params = replicas.params;
  replicas.step(2);
  // Without shares this returns at once (with them it would wait for a third worker and time out).
  for (const std::string& e : reduce_in_shares(reducer, 2)) EXPECT_EQ(e, "(no error)");
  const Tensor want = params[0][0].grad().clone().add_(params[1][0].grad());
  reducer.finish();
  EXPECT_TRUE(same_bits(params[0][0].grad(), want));
}

}  // namespace
}  // namespace dpe
