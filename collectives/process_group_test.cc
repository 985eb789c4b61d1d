// Every collective on every backend this machine has, against a direct computation: group sizes 1-4,
// element counts 0, 1, odd and not divisible by the group, every dtype, in place and out of place; the
// timeout, abort and argument-mismatch paths. The same checks run on CUDA logical devices (peer-copy) and
// a one-GPU NCCL group when a GPU is present.
#include "collectives/process_group.h"
#include "collectives/shared_memory_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "core/copy.h"
#include "core/ops.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"
#include "tests/testing/failing_new.h"
#include "tests/testing/gate.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::error_of;
using testing::run_members;


// Member r's input: small integers, exact in every dtype (also after a 4-way sum in uint8 and bfloat16).
std::vector<double> member_values(int r, int64_t count, int salt = 0) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<double>((i * 7 + r * 3 + salt) % 10);
  return v;
}

Tensor make(const std::vector<double>& values, DType dtype, const Device& device) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(dtype).to(device);
}

double reduce_ref(ReduceOp op, const std::vector<double>& xs, DType dtype) {
  double acc = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    if (op == ReduceOp::Max) acc = std::max(acc, xs[k]);
    else if (op == ReduceOp::Min) acc = std::min(acc, xs[k]);
    else acc += xs[k];
  }
  if (op == ReduceOp::Avg) {
    acc /= static_cast<double>(xs.size());
    if (!is_floating_point(dtype)) acc = std::trunc(acc);
  }
  return acc;
}

double tolerance(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::BFloat16 ? 2e-2 : (dtype == DType::Float32 ? 1e-6 : 1e-12);
}

void expect_values(const Tensor& t, const std::vector<double>& expected, DType dtype, const std::string& where) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expected[i], tolerance(dtype) * std::max(1.0, std::abs(expected[i]))) << where << " at " << i;
  }
}

struct GroupCase {
  std::vector<Device> devices;
  CollectiveBackend backend;
};

const std::vector<int64_t> kCounts = {0, 1, 7, 1000, 4099};

void check_all_reduce(const GroupCase& c) {
  int n = static_cast<int>(c.devices.size());
  ProcessGroup group(c.devices, {.backend = c.backend});
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      for (int64_t count : kCounts) {
        std::vector<Tensor> t(n);
        for (int r = 0; r < n; ++r) t[r] = make(member_values(r, count), dtype, c.devices[r]);
        auto errors = run_members(n, [&](int r) { group.all_reduce(r, t[r], op); });
        std::vector<std::vector<double>> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(member_values(r, count));
        std::vector<double> expected(count);
        for (int64_t i = 0; i < count; ++i) {
          std::vector<double> xs;
          for (int r = 0; r < n; ++r) xs.push_back(inputs[r][i]);
          expected[i] = reduce_ref(op, xs, dtype);
        }
        std::string where = detail::str_cat("all_reduce ", reduce_op_name(op), " ", dtype, " n=", n, " count=", count);
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(errors[r], "") << where;
          expect_values(t[r], expected, dtype, where);
        }
      }
    }
  }
  EXPECT_EQ(group.calls(Collective::AllReduce), static_cast<int64_t>(std::size(kAllDTypes) * 4 * kCounts.size()));
}

void check_broadcast_and_reduce(const GroupCase& c) {
  int n = static_cast<int>(c.devices.size());
  ProcessGroup group(c.devices, {.backend = c.backend});
  for (DType dtype : {DType::Float32, DType::Int64, DType::BFloat16}) {
    for (int64_t count : kCounts) {
      for (int root = 0; root < n; ++root) {
        std::vector<Tensor> t(n), u(n);
        for (int r = 0; r < n; ++r) {
          t[r] = make(member_values(r, count), dtype, c.devices[r]);
          u[r] = make(member_values(r, count), dtype, c.devices[r]);
        }
        auto errors = run_members(n, [&](int r) {
          group.broadcast(r, t[r], root);
          group.reduce(r, u[r], root, ReduceOp::Sum);
        });
        std::string where = detail::str_cat(dtype, " n=", n, " count=", count, " root=", root);
        std::vector<double> sum(count, 0.0);
        for (int r = 0; r < n; ++r) {
          auto v = member_values(r, count);
          for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
        }
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(errors[r], "") << where;
          expect_values(t[r], member_values(root, count), dtype, "broadcast " + where);
          // reduce: the root holds the sum, the others keep their input.
          expect_values(u[r], r == root ? sum : member_values(r, count), dtype, "reduce " + where);
        }
      }
    }
  }
}

void check_gathers_and_scatters(const GroupCase& c) {
  int n = static_cast<int>(c.devices.size());
  ProcessGroup group(c.devices, {.backend = c.backend});
  DType dtype = DType::Float32;
  for (int64_t count : kCounts) {
    std::string where = detail::str_cat("n=", n, " count=", count);
    std::vector<Tensor> input(n), flat(n), inplace(n), rs_out(n), rs_in(n), rs_flat_in(n), rs_inplace(n);
    std::vector<std::vector<Tensor>> outputs(n), rs_inputs(n);
    for (int r = 0; r < n; ++r) {
      TensorOptions on = TensorOptions(dtype).with_device(c.devices[r]);
      input[r] = make(member_values(r, count), dtype, c.devices[r]);
      flat[r] = zeros({n * count}, on);
      inplace[r] = zeros({n * count}, on);
      inplace[r].narrow(0, r * count, count).copy_(input[r]);
      for (int k = 0; k < n; ++k) {
        outputs[r].push_back(zeros({count}, on));
        rs_inputs[r].push_back(make(member_values(r, count, k), dtype, c.devices[r]));
      }
      rs_out[r] = zeros({count}, on);
      rs_flat_in[r] = cat(rs_inputs[r], 0).contiguous();
      rs_inplace[r] = rs_flat_in[r].clone();
      rs_in[r] = zeros({count}, on);
    }
    auto errors = run_members(n, [&](int r) {
      group.all_gather(r, outputs[r], input[r]);
      group.all_gather_into_tensor(r, flat[r], input[r]);
      group.all_gather_into_tensor(r, inplace[r], inplace[r].narrow(0, r * count, count));  // in place
      group.reduce_scatter(r, rs_out[r], rs_inputs[r], ReduceOp::Sum);
      group.reduce_scatter_tensor(r, rs_in[r], rs_flat_in[r], ReduceOp::Max);
      group.reduce_scatter_tensor(r, rs_inplace[r].narrow(0, r * count, count), rs_inplace[r], ReduceOp::Sum);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(errors[r], "") << where;
      std::vector<double> all;
      for (int k = 0; k < n; ++k) {
        expect_values(outputs[r][k], member_values(k, count), dtype, "all_gather " + where);
        auto v = member_values(k, count);
        all.insert(all.end(), v.begin(), v.end());
      }
      expect_values(flat[r], all, dtype, "all_gather_into_tensor " + where);
      expect_values(inplace[r], all, dtype, "all_gather_into_tensor in place " + where);
      std::vector<double> sum(count, 0.0), mx(count, -1e9);
      for (int k = 0; k < n; ++k) {
        auto v = member_values(k, count, r);  // member k's input slice for rank r
        for (int64_t i = 0; i < count; ++i) {
          sum[i] += v[i];
          mx[i] = std::max(mx[i], v[i]);
        }
      }
      expect_values(rs_out[r], sum, dtype, "reduce_scatter " + where);
      expect_values(rs_in[r], mx, dtype, "reduce_scatter_tensor " + where);
      expect_values(rs_inplace[r].narrow(0, r * count, count), sum, dtype, "reduce_scatter_tensor in place " + where);
    }
  }
}

void check_rooted_and_all_to_all(const GroupCase& c) {
  int n = static_cast<int>(c.devices.size());
  ProcessGroup group(c.devices, {.backend = c.backend});
  for (int root = 0; root < n; ++root) {
    // all_to_all with a different size per pair: member r sends (r + k) % 3 + 1 elements to member k.
    auto pair_count = [](int from, int to) { return static_cast<int64_t>((from + to) % 3 + 1); };
    std::vector<std::vector<Tensor>> a2a_in(n), a2a_out(n), gathered(n), scatter_in(n);
    std::vector<Tensor> scattered(n), gather_in(n);
    std::vector<std::vector<uint8_t>> objects(n);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < n; ++k) {
        a2a_in[r].push_back(make(member_values(r, pair_count(r, k), k), DType::Int64, c.devices[r]));
        a2a_out[r].push_back(zeros({pair_count(k, r)}, TensorOptions(DType::Int64).with_device(c.devices[r])));
        if (r == root) {
          gathered[r].push_back(zeros({5}, c.devices[r]));
          scatter_in[r].push_back(make(member_values(k, 5, 1), DType::Float32, c.devices[r]));
        }
      }
      gather_in[r] = make(member_values(r, 5), DType::Float32, c.devices[r]);
      scattered[r] = zeros({5}, c.devices[r]);
    }
    std::vector<uint8_t> payload = {1, 2, 3, static_cast<uint8_t>(root)};
    auto errors = run_members(n, [&](int r) {
      group.all_to_all(r, a2a_out[r], a2a_in[r]);
      group.gather(r, gathered[r], gather_in[r], root);
      group.scatter(r, scattered[r], scatter_in[r], root);
      group.barrier(r);
      objects[r] = group.broadcast_object(r, r == root ? payload : std::vector<uint8_t>{9}, root);
    });
    std::string where = detail::str_cat("n=", n, " root=", root);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(errors[r], "") << where;
      for (int k = 0; k < n; ++k) {
        expect_values(a2a_out[r][k], member_values(k, pair_count(k, r), r), DType::Int64, "all_to_all " + where);
        if (r == root) expect_values(gathered[r][k], member_values(k, 5), DType::Float32, "gather " + where);
      }
      expect_values(scattered[r], member_values(r, 5, 1), DType::Float32, "scatter " + where);
      EXPECT_EQ(objects[r], payload) << where;
    }
  }
}

GroupCase cpu_group(int n) { return {cpu_devices(n), CollectiveBackend::Auto}; }

TEST(ProcessGroupTest, AllReduceEveryOpDtypeAndSize) {
  for (int n : {1, 2, 3, 4}) check_all_reduce(cpu_group(n));
}

TEST(ProcessGroupTest, BroadcastAndReduceFromEveryRoot) {
  for (int n : {1, 2, 3, 4}) check_broadcast_and_reduce(cpu_group(n));
}

TEST(ProcessGroupTest, GathersAndScattersInAndOutOfPlace) {
  for (int n : {1, 2, 3, 4}) check_gathers_and_scatters(cpu_group(n));
}

TEST(ProcessGroupTest, RootedCollectivesAllToAllBarrierAndObjects) {
  for (int n : {1, 2, 3}) check_rooted_and_all_to_all(cpu_group(n));
}

TEST(ProcessGroupTest, AutoBackendForCpuDevices) {
  ProcessGroup group(cpu_devices(2));
  EXPECT_EQ(group.backend(), CollectiveBackend::Cpu);
  EXPECT_EQ(group.size(), 2);
}

TEST(ProcessGroupTest, ConstructionErrorsNameTheValues) {
  EXPECT_NE(error_of([] { ProcessGroup({}); }).find("no devices"), std::string::npos);
  auto devices = cpu_devices(2);
  EXPECT_NE(error_of([&] { ProcessGroup({devices[0], devices[0]}); }).find("cpu:0 is listed more than once"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ProcessGroup(devices, {.backend = CollectiveBackend::Nccl}); }).find("backend 'nccl' cannot serve cpu:0"),
            std::string::npos);
  // Refused before MPI is started.
  EXPECT_NE(error_of([&] { ProcessGroup(devices, {.backend = CollectiveBackend::MpiNccl}); })
                .find("backend 'mpi-nccl' cannot serve cpu:0; expected 'cpu' or 'mpi'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ProcessGroup(devices, {.timeout = std::chrono::milliseconds(0)}); }).find("timeout must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ProcessGroup({Device::cpu(999)}); }).find("cpu:999"), std::string::npos);
}

TEST(ProcessGroupTest, MissingMemberTimesOutNamingItAndAbortsUntilReset) {
  auto devices = cpu_devices(3);
  ProcessGroup group(devices, {.timeout = std::chrono::milliseconds(200)});
  std::vector<Tensor> t = {ones({4}, devices[0]), ones({4}, devices[1]), ones({4}, devices[2])};
  auto errors = run_members(3, [&](int r) {
    if (r != 2) group.all_reduce(r, t[r]);  // member 2 never comes
  });
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("all_reduce #1 timed out after 200 ms"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("cpu:2 (rank 2)"), std::string::npos) << errors[r];
    EXPECT_EQ(errors[r].find("cpu:1 (rank 1)"), std::string::npos) << errors[r];
  }
  // Aborted: even a complete set of members fails fast until reset().
  errors = run_members(3, [&](int r) { group.barrier(r); });
  for (int r = 0; r < 3; ++r) EXPECT_NE(errors[r].find("aborted"), std::string::npos) << errors[r];
  group.reset();
  errors = run_members(3, [&](int r) { group.all_reduce(r, t[r]); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "");
    EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(4, 3.0f));
  }
}

// A failure policy finds a timeout by its kind, never its text (collectives/rendezvous.h): the member whose
// wait ran out throws ErrorKind::Timeout; the member its abort woke, and one that comes after it, throw
// ErrorKind::Aborted with the same message; so does a member woken by another's failure (abort()).
TEST(ProcessGroupTest, OnlyTheMemberWhoseWaitRanOutThrowsTimeoutTheOthersAborted) {
  auto devices = cpu_devices(3);
  ProcessGroup group(devices, {.timeout = std::chrono::milliseconds(100)});
  std::vector<Tensor> t = {ones({4}, devices[0]), ones({4}, devices[1]), ones({4}, devices[2])};
  std::vector<std::optional<ErrorKind>> kinds(3);
  std::vector<std::string> messages(3);
  const auto member = [&](int r) {
    try {
      group.all_reduce(r, t[r]);
    } catch (const Error& e) {
      kinds[r] = e.kind();
      messages[r] = e.what();
    }
  };
  std::thread member0(member, 0), member1(member, 1);  // member 2 does not come in time
  member0.join();
  member1.join();
  member(2);
  int timeouts = 0, aborted = 0;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(kinds[r].has_value()) << "member " << r << " did not fail";
    EXPECT_NE(messages[r].find("all_reduce #1 timed out after 100 ms"), std::string::npos) << messages[r];
    timeouts += *kinds[r] == ErrorKind::Timeout;
    aborted += *kinds[r] == ErrorKind::Aborted;
  }
  EXPECT_EQ(*kinds[2], ErrorKind::Aborted);  // it came after the abort
  EXPECT_EQ(timeouts, 1) << messages[0] << "\n" << messages[1];
  EXPECT_EQ(aborted, 2) << messages[0] << "\n" << messages[1];
  const std::vector<int> missing = group.missing_at_last_timeout();  // member 2, and one still starting, if any
  EXPECT_NE(std::find(missing.begin(), missing.end(), 2), missing.end());
  ASSERT_TRUE(group.reset());
  std::optional<ErrorKind> woken;
  std::thread waiter([&] {
    try {
      group.barrier(0);
    } catch (const Error& e) {
      woken = e.kind();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  group.abort("replica 1 failed");
  waiter.join();
  EXPECT_EQ(woken, ErrorKind::Aborted);
}

TEST(ProcessGroupTest, AbortWakesWaitingMembers) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices);  // default timeout: minutes; abort must not wait for it
  std::thread waiter([&] {
    std::string e = error_of([&] { group.barrier(0); });
    EXPECT_NE(e.find("replica 1 failed"), std::string::npos) << e;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.abort("replica 1 failed");
  waiter.join();
}

// Out of memory in the failure handler (often the very reason a replica failed): abort cannot keep its reason,
// and must still wake the members, not throw and leave them waiting for the timeout (dpe_errors_test's rare
// hang under `ulimit -v`: the DDP failure handler's bad_alloc was swallowed and the partner waited).
TEST(ProcessGroupTest, AbortWakesWaitingMembersEvenWhenItCannotKeepItsReason) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices, ProcessGroupOptions{.timeout = std::chrono::milliseconds(20000)});
  std::thread waiter([&] {
    std::string e = error_of([&] { group.barrier(0); });
    EXPECT_NE(e.find("a member failed, and the reason was lost (out of memory while recording it)"),
              std::string::npos) << e;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string reason = "replica 1 failed: a reason too long for the short-string buffer";
  {
    testing::FailingNew fail(testing::FailingNew::kThisThread);  // this thread only: the waiter builds its error
    group.abort(reason);                                         // noexcept: a throw here would terminate
  }
  waiter.join();
  EXPECT_NE(error_of([&] { group.barrier(1); }).find("process group is aborted"), std::string::npos);  // until reset
  // An empty reason (all a message built out of memory may hold) aborts too: it once meant "not aborted".
  group.reset();
  group.abort("");
  EXPECT_NE(error_of([&] { group.barrier(1); }).find("the reason was lost"), std::string::npos);
  EXPECT_EQ(detail::str_cat_or_empty("x", 1), "x1");
  // Out of memory it returns what could be built (iostreams swallow the bad_alloc), possibly nothing; no throw.
  const std::string full = "a message longer than the short-string buffer 1";
  std::string built = "not built";
  {
    testing::FailingNew fail(testing::FailingNew::kThisThread);
    built = detail::str_cat_or_empty("a message longer than the short-string buffer ", 1);
  }
  EXPECT_LT(built.size(), full.size());
  EXPECT_EQ(full.substr(0, built.size()), built);
}

// Note [A member that leaves early]: member 0 times out at the second meeting while member 1 is still between
// the two (stalled there); member 0 returns and its frame, pieces and output go. Member 1 must still read
// member 0's pieces and write its output (the group keeps them), the group must stay aborted while member 1
// is inside (reset() refuses; member 0 cannot post again), and be usable again once member 1 has left. It
// read freed memory before (ASan: heap-use-after-free in all_reduce_into, SIGSEGV in check_common).
TEST(ProcessGroupTest, AMemberThatLeavesEarlyLeavesItsArgumentsToAPartnerStillInside) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices, {.timeout = std::chrono::milliseconds(200)});
  testing::Gate gate;
  group.inject_stall_for_tests(1, Collective::AllReduceInto, [&] { gate.wait(); });
  const int64_t count = 1000;
  Tensor out1 = zeros({count}, devices[1]);
  std::string error0, error1;
  std::thread member1([&] {
    std::vector<Tensor> in1 = {full({400}, 2.0, devices[1]), full({count - 400}, 2.0, devices[1])};
    error1 = error_of([&] { group.all_reduce_into(1, out1, in1); });
  });
  std::thread member0([&] {
    Tensor out0 = zeros({count}, devices[0]);
    std::vector<Tensor> in0 = {full({400}, 1.0, devices[0]), full({count - 400}, 1.0, devices[0])};
    error0 = error_of([&] { group.all_reduce_into(0, out0, in0); });
  });  // member 0's tensors go with its thread
  member0.join();
  EXPECT_NE(error0.find("all_reduce_into #1 timed out after 200 ms on cpu:0: waiting for cpu:1 (rank 1)"),
            std::string::npos) << error0;
  EXPECT_EQ(group.members_inside(), 1);
  EXPECT_FALSE(group.reset());  // member 1 is inside: the group stays aborted
  EXPECT_NE(error_of([&] { group.barrier(0); }).find("process group is aborted"), std::string::npos);
  gate.release();
  member1.join();
  // Member 1 reduced its half from both members' pieces (member 0's where member 0 left them), member 0 its own
  // half before it left: the whole sum.
  EXPECT_EQ(out1.to_vector<float>(), std::vector<float>(count, 3.0f));
  EXPECT_NE(error1.find("process group is aborted: all_reduce_into #1 timed out after 200 ms"), std::string::npos)
      << error1;
  EXPECT_EQ(group.members_inside(), 0);
  EXPECT_TRUE(group.reset());
  std::vector<Tensor> t = {ones({4}, devices[0]), ones({4}, devices[1])};
  EXPECT_EQ(run_members(2, [&](int r) { group.all_reduce(r, t[r]); }), std::vector<std::string>(2, ""));
  EXPECT_EQ(t[1].to_vector<float>(), std::vector<float>(4, 2.0f));
}

// shrink: the survivors in rank order, renumbered, with the group's options; the old group is aborted.
// (ncclCommShrink, the NCCL backend's way, needs two GPUs: process_group_test's CUDA cases.)
TEST(ProcessGroupTest, ShrinkKeepsTheSurvivorsInOrder) {
  auto devices = cpu_devices(4);
  ProcessGroup group(devices, {.timeout = std::chrono::milliseconds(1500)});
  std::shared_ptr<ProcessGroup> shrunk = group.shrink({2, 0});
  EXPECT_EQ(shrunk->devices(), (std::vector<Device>{devices[1], devices[3]}));
  EXPECT_EQ(shrunk->backend(), group.backend());
  EXPECT_EQ(shrunk->timeout(), std::chrono::milliseconds(1500));
  std::vector<Tensor> t = {full({5}, 1.0, shrunk->devices()[0]), full({5}, 2.0, shrunk->devices()[1])};
  EXPECT_EQ(run_members(2, [&](int r) { shrunk->all_reduce(r, t[r]); }), std::vector<std::string>(2, ""));
  for (const Tensor& x : t) EXPECT_EQ(x.to_vector<float>(), std::vector<float>(5, 3.0f));
  for (const std::string& e : run_members(4, [&](int r) { group.barrier(r); })) {
    EXPECT_NE(e.find("the group was shrunk to 2 members"), std::string::npos) << e;
  }
  EXPECT_NE(error_of([&] { shrunk->shrink({2}); }).find("rank 2 is not one of the 2 members"), std::string::npos);
  EXPECT_NE(error_of([&] { shrunk->shrink({1, 1}); }).find("rank 1 is listed twice"), std::string::npos);
  EXPECT_NE(error_of([&] { shrunk->shrink({0, 1}); }).find("excluding 2 of 2 members leaves none"),
            std::string::npos);
}

// set_work_shares: members reduce parts of every buffer proportional to their shares (work_range), and the
// results are the same bits whatever the shares (each element is still summed over the members in order).
TEST(ProcessGroupTest, WorkSharesMoveWhoReducesNotWhatIsComputed) {
  // The ranges tile [0, count), follow the shares to within a 64-byte line, and are equal without shares.
  for (const std::vector<double>& shares : {std::vector<double>{}, std::vector<double>{0.1, 0.6, 0.3},
                                            std::vector<double>{1e-9, 1e-9, 1 - 2e-9}}) {
    int64_t next = 0;
    for (int r = 0; r < 3; ++r) {
      auto [begin, end] = collectives::work_range(100003, 4, 3, r, shares);
      EXPECT_EQ(begin, next) << r;
      const double share = shares.empty() ? 1.0 / 3 : shares[r];
      EXPECT_NEAR(static_cast<double>(end - begin), share * 100003, 16) << r;
      next = end;
    }
    EXPECT_EQ(next, 100003);
  }
  auto devices = cpu_devices(3);
  ProcessGroup group(devices);
  std::vector<std::vector<float>> results;
  for (const std::vector<double>& shares : {std::vector<double>{}, std::vector<double>{1, 6, 3},
                                            std::vector<double>{1e-6, 1e-6, 1}}) {
    group.set_work_shares(shares);
    EXPECT_EQ(group.work_shares().size(), shares.size());
    std::vector<Tensor> t;
    for (int r = 0; r < 3; ++r) t.push_back(randn({100003}, devices[r]) * (r + 1.0));
    const std::vector<Tensor> inputs = t;
    for (Tensor& x : t) x = x.clone();
    EXPECT_EQ(run_members(3, [&](int r) { group.all_reduce(r, t[r]); }), std::vector<std::string>(3, ""));
    for (int r = 1; r < 3; ++r) EXPECT_EQ(t[r].to_vector<float>(), t[0].to_vector<float>());
    // Against the sum in member order, element by element.
    std::vector<float> want = inputs[0].to_vector<float>();
    for (int r = 1; r < 3; ++r) {
      std::vector<float> x = inputs[r].to_vector<float>();
      for (size_t i = 0; i < want.size(); ++i) want[i] += x[i];
    }
    EXPECT_EQ(t[0].to_vector<float>(), want);
  }
  EXPECT_EQ(group.work_shares(), (std::vector<double>{1e-6 / (1 + 2e-6), 1e-6 / (1 + 2e-6), 1 / (1 + 2e-6)}));
  EXPECT_NE(error_of([&] { group.set_work_shares({1, 2}); }).find("2 shares for 3 members"), std::string::npos);
  EXPECT_NE(error_of([&] { group.set_work_shares({1, 0, 2}); })
                .find("share 0 of member 1 (cpu:1) is not a positive finite number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group.set_work_shares({1, 2, std::nan("")}); }).find("share nan of member 2"),
            std::string::npos);
}

// all_reduce_into (DDP's bucket): every member's output = sum over members of scale x its pieces, read where
// they are; a piece may be the output's own slice (an attached gradient). Small integers and power-of-two
// scales make the expected sums exact in any order, so the comparison is bit for bit.
TEST(ProcessGroupTest, AllReduceIntoSumsEveryMembersWeightedPieces) {
  const std::vector<int64_t> piece_sizes = {0, 1, 7, 1000, 4099};
  const int64_t total = 5107;
  const std::vector<double> scales = {0.5, 0.25, 2.0, 1.0};
  for (int n : {1, 2, 3, 4}) {
    auto devices = cpu_devices(n);
    ProcessGroup group(devices);
    for (DType dtype : {DType::Float32, DType::Float64}) {
      for (const std::vector<double>& shares : {std::vector<double>{}, std::vector<double>{1, 6, 3, 2}}) {
        group.set_work_shares(shares.empty() ? shares : std::vector<double>(shares.begin(), shares.begin() + n));
        std::vector<Tensor> outputs(n);
        std::vector<std::vector<Tensor>> pieces(n);
        std::vector<double> want(total, 0.0);
        for (int r = 0; r < n; ++r) {
          outputs[r] = make(std::vector<double>(total, -1.0), dtype, devices[r]);
          int64_t offset = 0;
          for (size_t i = 0; i < piece_sizes.size(); ++i) {
            std::vector<double> v = member_values(r, piece_sizes[i], static_cast<int>(i));
            for (int64_t j = 0; j < piece_sizes[i]; ++j) want[offset + j] += scales[r] * v[j];
            if (i == 3) {
              // In place: the output's own slice, holding the piece.
              Tensor slot = outputs[r].narrow(0, offset, piece_sizes[i]);
              copy_into(slot, make(v, dtype, devices[r]));
              pieces[r].push_back(slot);
            } else {
              pieces[r].push_back(make(v, dtype, devices[r]));
            }
            offset += piece_sizes[i];
          }
        }
        EXPECT_EQ(run_members(n, [&](int r) { group.all_reduce_into(r, outputs[r], pieces[r], scales[r]); }),
                  std::vector<std::string>(n, ""));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(outputs[r].to_vector<double>(), want) << n << " members, " << dtype << ", member " << r;
        }
      }
    }
    EXPECT_EQ(group.calls(Collective::AllReduceInto), 4);
    EXPECT_EQ(group.calls(Collective::AllReduce), 0);
  }
}

TEST(ProcessGroupTest, AllReduceIntoRefusesBadPiecesNamingThem) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices);
  auto call = [&](std::vector<Tensor> out, std::vector<std::vector<Tensor>> in, std::vector<double> scale) {
    return run_members(2, [&](int r) { group.all_reduce_into(r, out[r], in[r], scale[r]); });
  };
  std::vector<Tensor> out = {zeros({6}, devices[0]), zeros({6}, devices[1])};
  auto pieces = [&](int r, std::vector<int64_t> sizes) {
    std::vector<Tensor> p;
    for (int64_t k : sizes) p.push_back(ones({k}, devices[r]));
    return p;
  };
  // A local error (this member's counts) aborts, so the partner does not wait for it.
  auto errors = call(out, {pieces(0, {2, 4}), pieces(1, {2, 3})}, {1, 1});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed 2 inputs of 5 elements in all for an output of 6"),
              std::string::npos) << errors[r];
  }
  group.reset();
  errors = call(out, {pieces(0, {2, 4}), pieces(1, {6})}, {1, 1});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed 1 inputs but member 0 (cpu:0) passed 2"), std::string::npos)
        << errors[r];
  }
  errors = call(out, {pieces(0, {6}), pieces(1, {6})}, {1, std::nan("")});
  EXPECT_NE(errors[1].find("member 1 (cpu:1) passed scale nan; expected a finite number"), std::string::npos)
      << errors[1];
  group.reset();
  errors = call(out, {{out[0].narrow(0, 1, 2), ones({4}, devices[0])}, pieces(1, {2, 4})}, {1, 1});
  EXPECT_NE(errors[0].find("member 0 (cpu:0) passed input 0 overlapping the output away from its own place"),
            std::string::npos) << errors[0];
  group.reset();
  errors = call(out, {{ones({6}, devices[0]).to(DType::Float64)}, pieces(1, {6})}, {1, 1});
  EXPECT_NE(errors[0].find("passed input 0 of float64 for an output of float32"), std::string::npos) << errors[0];
  group.reset();
  // Still usable.
  errors = call(out, {pieces(0, {2, 4}), pieces(1, {1, 5})}, {1, 1});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed input 0 of 1 elements but member 0 (cpu:0)'s has 2"),
              std::string::npos) << errors[r];
  }
  EXPECT_EQ(call(out, {pieces(0, {1, 5}), pieces(1, {1, 5})}, {1, 0.5}), std::vector<std::string>(2, ""));
  EXPECT_EQ(out[1].to_vector<float>(), std::vector<float>(6, 1.5f));
}

TEST(ProcessGroupTest, MismatchedArgumentsFailOnEveryMemberAndKeepTheGroupUsable) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices);
  std::vector<Tensor> t = {ones({4}, devices[0]), ones({5}, devices[1])};
  auto errors = run_members(2, [&](int r) { group.all_reduce(r, t[r]); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed a tensor of 5 float32 elements on cpu:1 but member 0's has 4"),
              std::string::npos) << errors[r];
  }
  errors = run_members(2, [&](int r) {
    if (r == 0) group.barrier(r);
    else group.broadcast(r, t[r], 0);
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("called broadcast while member 0 (cpu:0) called barrier"), std::string::npos) << errors[r];
  errors = run_members(2, [&](int r) { group.broadcast(r, t[r], r); });  // roots disagree
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("passed root 1"), std::string::npos) << errors[r];
  std::vector<Tensor> wrong_device = {ones({4}, devices[1]), ones({4}, devices[1])};
  errors = run_members(2, [&](int r) { group.all_reduce(r, wrong_device[r]); });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("member 0 (cpu:0) passed tensor on cpu:1; expected cpu:0"), std::string::npos) << errors[r];
  // Still usable.
  std::vector<Tensor> ok = {ones({4}, devices[0]), ones({4}, devices[1])};
  errors = run_members(2, [&](int r) { group.all_reduce(r, ok[r]); });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(ok[1].to_vector<float>(), std::vector<float>(4, 2.0f));
  EXPECT_EQ(group.calls(Collective::AllReduce), 1);
}

// gather and scatter check the root's list against every member's tensor, naming both sides.
TEST(ProcessGroupTest, GatherAndScatterMismatchesNameTheRootsEntry) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices);
  std::vector<Tensor> mine = {ones({4}, devices[0]), ones({5}, devices[1])};
  std::vector<Tensor> roots_list = {ones({4}, devices[0]), ones({4}, devices[0])};
  auto errors = run_members(2, [&](int r) { group.gather(r, r == 0 ? roots_list : std::vector<Tensor>{}, mine[r], 0); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed an input of 5 float32 elements on cpu:1 but the root's output "
                             "for it has 4 float32 elements on cpu:0"),
              std::string::npos) << errors[r];
  }
  errors = run_members(2, [&](int r) { group.scatter(r, mine[r], r == 0 ? roots_list : std::vector<Tensor>{}, 0); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 1 (cpu:1) passed an output of 5 float32 elements on cpu:1 but the root's input "
                             "for it has 4"),
              std::string::npos) << errors[r];
  }
  std::vector<Tensor> short_list = {ones({4}, devices[0])};
  errors = run_members(2, [&](int r) { group.gather(r, r == 0 ? short_list : std::vector<Tensor>{}, mine[r], 0); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("member 0 (cpu:0) passed 1 outputs; expected one per member (2)"), std::string::npos)
        << errors[r];
  }
}

TEST(ProcessGroupTest, ALocalArgumentErrorAbortsSoPartnersDoNotWait) {
  auto devices = cpu_devices(2);
  ProcessGroup group(devices);
  std::vector<Tensor> out = {zeros({8}, devices[0]), zeros({7}, devices[1])};
  std::vector<Tensor> in = {ones({4}, devices[0]), ones({4}, devices[1])};
  auto errors = run_members(2, [&](int r) { group.all_gather_into_tensor(r, out[r], in[r]); });
  EXPECT_NE(errors[1].find("output of 7 elements; expected 2 x 4"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("output of 7 elements; expected 2 x 4"), std::string::npos) << errors[0];
}

#if DPE_WITH_CUDA
// CUDA: three logical devices on GPU 0 (peer-copy backend), and a one-member NCCL group.
class ProcessGroupCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::physical_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
    static bool mapped = [] {
      set_cuda_logical_devices({0, 0, 0});
      return true;
    }();
    (void)mapped;
  }
  GroupCase peer_group(int n) {
    std::vector<Device> d;
    for (int i = 0; i < n; ++i) d.push_back(Device::cuda(i));
    return {d, CollectiveBackend::Auto};
  }
};

TEST_F(ProcessGroupCudaTest, PeerCopyBackendOnLogicalDevices) {
  EXPECT_EQ(ProcessGroup(peer_group(2).devices).backend(), CollectiveBackend::PeerCopy);
  EXPECT_NE(error_of([&] { ProcessGroup(peer_group(2).devices, {.backend = CollectiveBackend::Nccl}); }).find("share a GPU"),
            std::string::npos);
  for (int n : {1, 2, 3}) {
    check_broadcast_and_reduce(peer_group(n));
    check_gathers_and_scatters(peer_group(n));
    check_rooted_and_all_to_all(peer_group(n));
  }
}

TEST_F(ProcessGroupCudaTest, PeerCopyAllReduce) {
  for (int n : {2, 3}) check_all_reduce(peer_group(n));
}

TEST_F(ProcessGroupCudaTest, NcclCommunicatorOnOneGpu) {
  GroupCase one{{Device::cuda(0)}, CollectiveBackend::Nccl};
  check_all_reduce(one);
  check_broadcast_and_reduce(one);
  check_gathers_and_scatters(one);
}

// A shrink on the one GPU there is: by no member, which NCCL's ncclCommShrink refuses, so NcclComms makes the
// new communicator with ncclCommSplit (and aborts the old); excluding a member needs two GPUs.
TEST_F(ProcessGroupCudaTest, NcclShrinkMakesAWorkingCommunicator) {
  ProcessGroup group({Device::cuda(0)}, {.backend = CollectiveBackend::Nccl});
  std::shared_ptr<ProcessGroup> shrunk = group.shrink({});
  EXPECT_EQ(shrunk->backend(), CollectiveBackend::Nccl);
  Tensor t = full({7}, 2.5, Device::cuda(0));
  shrunk->all_reduce(0, t);
  EXPECT_EQ(t.to(Device::cpu(0)).to_vector<float>(), std::vector<float>(7, 2.5f));
  EXPECT_NE(error_of([&] { group.all_reduce(0, t); }).find("the group was shrunk to 1 members"), std::string::npos);
}
#endif

}  // namespace
}  // namespace dpe
