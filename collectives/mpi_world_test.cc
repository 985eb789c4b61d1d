// Runs as every process of `mpirun -np 2` (mpi_world_test.sh); each process runs every test, and the tests
// that need the other process meet it in the same order.
#include "collectives/mpi_world.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace dpe::collectives {
namespace {

using namespace std::chrono_literals;

int env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) ADD_FAILURE() << name << " is not set";
  return value == nullptr ? -1 : std::atoi(value);
}

TEST(LaunchEnvironment, AcceptsUnsetOrEqualValuesAndNamesAMismatch) {
  const ProcessPlace place{.rank = 1, .size = 2, .local_rank = 1, .local_size = 2, .host = "node7"};
  std::map<std::string, std::string> env;
  const auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_NO_THROW(check_launch_environment(place, getenv));
  env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}};
  EXPECT_NO_THROW(check_launch_environment(place, getenv));
  for (const char* bad : {"7", "1x", "", " 1"}) {
    env["RANK"] = bad;
    try {
      check_launch_environment(place, getenv);
      ADD_FAILURE() << "RANK=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("RANK=") + bad + " in the environment, but MPI says 1"),
                std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("on node7"), std::string::npos) << e.what();
    }
  }
  env = {{"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_THROW(check_launch_environment(place, getenv), Error);
}

TEST(MpiWorld, PlaceIsTheLaunchersAndIsExportedUnderTorchrunsNames) {
  ASSERT_TRUE(MpiWorld::launched_by_mpi()) << "run this test under mpirun (mpi_world_test.sh)";
  const ProcessPlace& place = MpiWorld::get().place();
  EXPECT_EQ(place.size, env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(place.rank, env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_EQ(place.local_rank, env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_EQ(place.local_size, env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_FALSE(place.host.empty());
  EXPECT_EQ(env_int("RANK"), place.rank);
  EXPECT_EQ(env_int("WORLD_SIZE"), place.size);
  EXPECT_EQ(env_int("LOCAL_RANK"), place.local_rank);
  EXPECT_EQ(env_int("LOCAL_WORLD_SIZE"), place.local_size);
}

template <typename T>
void expect_all_reduce(MpiComm& comm, DType dtype, ReduceOp op) {
  const int n = 1000, p = comm.size();
  std::vector<T> data(n);
  for (int i = 0; i < n; ++i) data[i] = static_cast<T>((comm.rank() + 1) * 1000 + i);
  comm.all_reduce(data.data(), n, dtype, op, reduce_op_name(op));
  for (int i = 0; i < n; ++i) {
    T want = 0;
    for (int r = 0; r < p; ++r) {
      const T v = static_cast<T>((r + 1) * 1000 + i);
      want = r == 0 ? v : op == ReduceOp::Max ? std::max(want, v) : op == ReduceOp::Min ? std::min(want, v) : want + v;
    }
    if (op == ReduceOp::Avg) want /= p;
    ASSERT_EQ(data[i], want) << dtype_name(dtype) << " " << reduce_op_name(op) << " element " << i;
  }
}

TEST(MpiComm, AllReduceCombinesEveryProcess) {
  MpiComm comm(30s);
  ASSERT_EQ(comm.size(), MpiWorld::get().place().size);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    expect_all_reduce<float>(comm, DType::Float32, op);
    expect_all_reduce<double>(comm, DType::Float64, op);
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    expect_all_reduce<int64_t>(comm, DType::Int64, op);
    expect_all_reduce<int32_t>(comm, DType::Int32, op);
  }
  EXPECT_EQ(comm.collectives_started(), 14);
  float empty = 0;
  comm.all_reduce(&empty, 0, DType::Float32, ReduceOp::Sum, "empty");  // every process meets all the same
}

TEST(MpiComm, ArgumentsAreCheckedBeforeAnyProcessIsWaitedFor) {
  MpiComm comm(30s);
  float x = 1;
  EXPECT_THROW(comm.all_reduce(&x, 1, DType::BFloat16, ReduceOp::Sum, "bf16"), Error);
  EXPECT_THROW(comm.all_reduce(&x, -1, DType::Float32, ReduceOp::Sum, "negative"), Error);
  int64_t i = 1;
  EXPECT_THROW(comm.all_reduce(&i, 1, DType::Int64, ReduceOp::Avg, "int avg"), Error);
  EXPECT_EQ(comm.collectives_started(), 0);
  EXPECT_THROW(MpiComm(0ms), Error);
}

TEST(MpiComm, DifferentSizesAreRefusedOnEveryProcessNamingEach) {
  MpiComm comm(30s);
  std::vector<float> x(1000, 1.0f);
  const int64_t mine = comm.rank() == 1 ? 999 : 1000;
  try {
    comm.all_reduce(x.data(), mine, DType::Float32, ReduceOp::Sum, "bucket 2");
    ADD_FAILURE() << "different sizes were reduced";
  } catch (const Error& e) {
    std::string want = "collective #1 (bucket 2): the processes passed different arguments ({elements, dtype, op}): "
                       "rank 0 {1000, 0, 0}, rank 1 {999, 0, 0}";
    EXPECT_EQ(std::string(e.what()).substr(0, want.size()), want);
  }
  std::vector<char> bytes(8, static_cast<char>(comm.rank()));
  EXPECT_THROW(comm.broadcast(bytes.data(), 8, comm.rank(), "different roots"), Error);
  // Nothing moved, and the communicator goes on.
  EXPECT_EQ(x[0], 1.0f);
  comm.all_reduce(x.data(), 1000, DType::Float32, ReduceOp::Sum, "bucket 3");
  EXPECT_EQ(x[999], static_cast<float>(comm.size()));
  comm.broadcast(bytes.data(), 8, 1, "from rank 1");
  EXPECT_EQ(bytes[7], 1);
}

// Rank 0 waits in a barrier that rank 1 never enters: rank 0 gets an error naming rank 1, the communicator is
// aborted, and both processes go on with other communicators.
TEST(MpiComm, ARankThatDoesNotArriveIsNamedAfterTheTimeout) {
  MpiComm late(300ms);
  MpiComm after(30s);
  if (late.rank() == 0) {
    try {
      late.barrier("bucket 3");
      ADD_FAILURE() << "the barrier returned without rank 1";
    } catch (const Error& e) {
      std::string missing;
      for (int r = 1; r < late.size(); ++r) missing += (r > 1 ? ", " : "") + std::to_string(r);
      const std::string want = std::string("collective #1 (bucket 3): rank") + (late.size() > 2 ? "s " : " ") +
                               missing + " did not arrive within 0.3 s";
      EXPECT_EQ(e.what(), want);
      EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    }
    float x = 1;
    try {
      late.all_reduce(&x, 1, DType::Float32, ReduceOp::Sum, "bucket 4");
      ADD_FAILURE() << "an aborted communicator ran a collective";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("collective #2 (bucket 4): the communicator was aborted by an earlier "
                                           "failure: collective #1 (bucket 3)"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::Aborted);
    }
  }
  after.barrier("after the timeout");
}

// The last rank arrives at an all-reduce and stops (SIGSTOP) before its transfer: the others' errors name it
// (Note [Naming the rank that stalls a transfer]); rank 0 then lets it go on (SIGCONT).
TEST(MpiComm, ARankThatStopsAfterArrivingIsNamed) {
  MpiComm stalled(300ms);
  MpiComm after(30s);
  const int last = stalled.size() - 1;
  std::vector<int64_t> pids(static_cast<size_t>(after.size()), 0);
  pids[after.rank()] = getpid();
  after.all_reduce(pids.data(), after.size(), DType::Int64, ReduceOp::Sum, "pids");
  if (stalled.rank() == last) MpiComm::set_after_arrival_hook_for_testing([] { raise(SIGSTOP); });
  float x = 1;
  try {
    stalled.all_reduce(&x, 1, DType::Float32, ReduceOp::Sum, "bucket 7");
    EXPECT_EQ(stalled.rank(), last) << "the transfer finished without the stopped rank";
  } catch (const Error& e) {
    if (stalled.rank() != last) {
      EXPECT_EQ(std::string(e.what()), "collective #1 (bucket 7): every rank arrived but the transfer did not finish "
                                       "within 0.3 s; rank " + std::to_string(last) +
                                       " stopped answering after arriving (stopped, or stuck outside MPI)");
      EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    }
  }
  MpiComm::set_after_arrival_hook_for_testing(nullptr);
  if (stalled.rank() == 0) kill(static_cast<pid_t>(pids[last]), SIGCONT);
  after.barrier("after the stall");
}

}  // namespace
}  // namespace dpe::collectives
