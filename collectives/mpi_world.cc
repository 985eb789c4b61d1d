#include "collectives/mpi_world.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "core/error.h"

namespace dpe::collectives {

namespace {

// Non-overtaking order between two ranks on one tag keeps arrival tokens of consecutive collectives apart;
// the payload (the sequence number) is checked all the same.
constexpr int kArrivalTag = 1;
constexpr int kFailureTag = 2;
constexpr int kRollCallTag = 3;

std::atomic<void (*)()> after_arrival_hook{nullptr};
// Large buffers go in pieces of 1 MiB, one collective after the other: Open MPI's non-blocking all-reduce
// between 2 processes on this machine reaches 4.7 GB/s at 1-4 MiB but 1.0 GB/s on one 64 MiB buffer, and
// 2.9 GB/s on the same 64 MiB in 1 MiB pieces (256 KiB: 2.7, 4 MiB: 2.3; docs/BENCHMARKS.md). It also keeps
// every count far below MPI's int limit.
constexpr int64_t kPieceBytes = int64_t{1} << 20;

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    default: break;
  }
  DPE_CHECK(false, "MPI all_reduce: dtype ", dtype_name(dtype), " is not supported (float32, float64, int32, int64)");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  DPE_INTERNAL_ASSERT(false, "unknown ReduceOp ", static_cast<int>(op));
}

std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

// Polls test() until it reports completion or the deadline passes. Polling is what makes Open MPI progress a
// non-blocking collective (a 64 MB all-reduce is many pipelined steps), so for the first 50 ms it polls
// back to back, yielding the core between polls; a wait that long is a late process, not a transfer, and
// then it polls every millisecond, leaving the cores to the device threads. Returns false past the deadline.
template <typename Test>
bool poll_until(std::chrono::steady_clock::time_point deadline, Test test) {
  const auto patient_after = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  while (!test()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (now < patient_after) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return true;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

std::string mpi_error_string(int rc) {
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, message, &length) != MPI_SUCCESS) return detail::str_cat("MPI error ", rc);
  return std::string(message, static_cast<size_t>(length));
}

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw Error(detail::str_cat(call, " failed: ", mpi_error_string(rc)));
}

namespace {

// torchrun's variables and their values for `place`.
std::array<std::pair<const char*, int>, 4> torchrun_variables(const ProcessPlace& place) {
  return {{{"RANK", place.rank}, {"WORLD_SIZE", place.size},
           {"LOCAL_RANK", place.local_rank}, {"LOCAL_WORLD_SIZE", place.local_size}}};
}

}  // namespace

void check_launch_environment(const ProcessPlace& place, const std::function<const char*(const char*)>& getenv) {
  for (const auto& [name, value] : torchrun_variables(place)) {
    const char* set = getenv(name);
    if (set == nullptr) continue;
    const std::string_view text(set);
    int parsed = -1;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    const bool same = error == std::errc() && end == text.data() + text.size() && parsed == value;
    DPE_CHECK(same, "inconsistent launch: ", name, "=", set, " in the environment, but MPI says ", value,
              " (rank ", place.rank, " of ", place.size, ", local rank ", place.local_rank, " of ",
              place.local_size, " on ", place.host, "); unset ", name, " or launch every process the same way");
  }
}

MpiWorld& MpiWorld::get() {
  static MpiWorld world;
  return world;
}

bool MpiWorld::launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

MpiWorld::MpiWorld() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  } else {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  // World-level calls below return their errors instead of ending the job.
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  DPE_CHECK(provided == MPI_THREAD_MULTIPLE, "MPI provides ", thread_level_name(provided),
            "; dpe needs MPI_THREAD_MULTIPLE (every device thread calls MPI): use an MPI built with thread "
            "support (Debian's Open MPI has it)",
            initialized ? ", and initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) before dpe" : "");

  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &place_.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &place_.size), "MPI_Comm_size");
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, place_.rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  check_mpi(MPI_Comm_rank(local, &place_.local_rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(local, &place_.local_size), "MPI_Comm_size");
  check_mpi(MPI_Comm_free(&local), "MPI_Comm_free");
  char host[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  check_mpi(MPI_Get_processor_name(host, &length), "MPI_Get_processor_name");
  place_.host.assign(host, static_cast<size_t>(length));

  check_launch_environment(place_, [](const char* name) { return std::getenv(name); });
  for (const auto& [name, value] : torchrun_variables(place_)) ::setenv(name, std::to_string(value).c_str(), 1);
}

namespace {

// A communicator of dpe's own over every process (collective: every process calls it, in the same order), whose
// errors are returned, not fatal; sets *rank and *size.
MPI_Comm duplicate_world(int* rank, int* size) {
  MpiWorld::get();
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm, rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, size), "MPI_Comm_size");
  return comm;
}

}  // namespace

MpiAbortChannel::MpiAbortChannel() { comm_ = duplicate_world(&rank_, &size_); }

MpiAbortChannel::~MpiAbortChannel() {
  // After a failure, messages may still be in flight on it; the job is ending anyway.
  if (!announced_ && !heard_any_) MPI_Comm_free(&comm_);
}

void MpiAbortChannel::announce(const std::string& reason) {
  if (heard_any_ || announced_.exchange(true)) return;
  // Kept alive past this call: the sends complete when MPI moves them, and the process may end first. Out of
  // memory (often why a replica failed), a fixed text still tells the peers, so that they do not wait for
  // their timeouts.
  std::string_view text = detail::kReasonLost;
  try {
    if (!reason.empty()) text = *new std::string(reason);
  } catch (...) {
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, peer, kFailureTag, comm_, &request) ==
        MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
}

std::string MpiAbortChannel::heard() {
  if (heard_any_) return heard_;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || heard_any_) return heard_any_ ? heard_ : "";
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, comm_, &flag, &status) != MPI_SUCCESS || !flag) return "";
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
  check_mpi(MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kFailureTag, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv");
  heard_ = detail::str_cat("rank ", status.MPI_SOURCE, " failed: ", text);
  heard_any_ = true;
  return heard_;
}

MpiComm::MpiComm(std::chrono::milliseconds timeout, MpiAbortChannel* failures) : timeout_(timeout), failures_(failures) {
  DPE_CHECK(timeout.count() > 0, "MpiComm: timeout must be positive, got ", timeout.count(), " ms");
  comm_ = duplicate_world(&rank_, &size_);
}

MpiComm::~MpiComm() {
  // An aborted communicator may still have requests in flight that name it; the job is ending anyway.
  if (aborted_.empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::check_failures(const std::string& what) {
  if (failures_ == nullptr) return;
  const std::string heard = failures_->heard();
  if (heard.empty()) return;
  aborted_ = detail::str_cat("collective #", seq_, " (", what, "): ", heard);
  throw Error(aborted_, ErrorKind::Aborted);
}

void MpiComm::check_not_aborted(const std::string& what) const {
  DPE_CHECK_WITH(ErrorKind::Aborted, aborted_.empty(), "collective #", seq_ + 1, " (", what,
                 "): the communicator was aborted by an earlier failure: ", aborted_);
}

void MpiComm::arrive(const std::string& what, const std::vector<int64_t>& signature, const char* signature_names) {
  check_not_aborted(what);
  ++seq_;
  if (size_ == 1) return;
  // A token is the sequence number and the signature. Owned by MPI until every request completes: past a
  // timeout it is left to the ending job, since MPI may still write into it after this call has thrown.
  const int width = 1 + static_cast<int>(signature.size());
  struct Tokens {
    std::vector<int64_t> sent;
    std::vector<int64_t> received;  // width per rank
    std::vector<MPI_Request> requests;
  };
  auto tokens = std::make_unique<Tokens>();
  tokens->sent.push_back(seq_);
  tokens->sent.insert(tokens->sent.end(), signature.begin(), signature.end());
  tokens->received.assign(static_cast<size_t>(size_ * width), -1);
  std::copy(tokens->sent.begin(), tokens->sent.end(), tokens->received.begin() + rank_ * width);
  tokens->requests.reserve(2 * static_cast<size_t>(size_));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    tokens->requests.emplace_back();
    check_mpi(MPI_Irecv(&tokens->received[peer * width], width, MPI_INT64_T, peer, kArrivalTag, comm_,
                        &tokens->requests.back()), "MPI_Irecv");
    tokens->requests.emplace_back();
    check_mpi(MPI_Isend(tokens->sent.data(), width, MPI_INT64_T, peer, kArrivalTag, comm_, &tokens->requests.back()),
              "MPI_Isend");
  }
  int done = 0;
  bool failed_elsewhere = false;
  const bool arrived = poll_until(std::chrono::steady_clock::now() + timeout_, [&] {
    check_mpi(MPI_Testall(static_cast<int>(tokens->requests.size()), tokens->requests.data(), &done,
                          MPI_STATUSES_IGNORE), "MPI_Testall");
    failed_elsewhere = done == 0 && failures_ != nullptr && !failures_->heard().empty();
    return done != 0 || failed_elsewhere;
  });
  if (failed_elsewhere) (void)tokens.release();  // MPI may still write into them
  if (failed_elsewhere) check_failures(what);
  const auto token_of = [&](int peer) { return tokens->received.begin() + peer * width; };
  if (!arrived) {
    // MPI_Testall left every request as it was; a peer whose token has not been received is missing.
    std::string missing;
    int missing_count = 0;
    for (int peer = 0, k = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      int received = 0;
      check_mpi(MPI_Test(&tokens->requests[2 * k++], &received, MPI_STATUS_IGNORE), "MPI_Test");
      if (!received) missing += detail::str_cat(missing_count++ == 0 ? "" : ", ", peer);
    }
    (void)tokens.release();
    aborted_ = detail::str_cat("collective #", seq_, " (", what, "): rank", missing_count > 1 ? "s " : " ", missing,
                               " did not arrive within ", seconds(timeout_));
    throw Error(aborted_, ErrorKind::Timeout);
  }
  bool agree = true;
  for (int peer = 0; peer < size_; ++peer) {
    DPE_INTERNAL_ASSERT(*token_of(peer) == seq_, "rank ", peer, " sent arrival token ", *token_of(peer),
                        " for collective #", seq_);
    agree = agree && std::equal(token_of(peer), token_of(peer) + width, token_of(0));
  }
  if (agree) {
    if (void (*hook)() = after_arrival_hook.load()) hook();
    return;
  }
  std::string values;
  for (int peer = 0; peer < size_; ++peer) {
    values += detail::str_cat(peer == 0 ? "" : ", ", "rank ", peer, " {");
    for (int i = 1; i < width; ++i) values += detail::str_cat(i == 1 ? "" : ", ", *(token_of(peer) + i));
    values += "}";
  }
  throw Error(detail::str_cat("collective #", seq_, " (", what, "): the processes passed different arguments ({",
                              signature_names, "}): ", values));
}

void MpiComm::wait(MPI_Request& request, std::chrono::steady_clock::time_point deadline, const std::string& what) {
  int done = 0;
  int rc = MPI_SUCCESS;
  bool failed_elsewhere = false;
  const bool finished = poll_until(deadline, [&] {
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    failed_elsewhere = rc == MPI_SUCCESS && done == 0 && failures_ != nullptr && !failures_->heard().empty();
    return rc != MPI_SUCCESS || done != 0 || failed_elsewhere;
  });
  if (failed_elsewhere) check_failures(what);
  if (finished && rc == MPI_SUCCESS) return;
  if (finished) {
    aborted_ = detail::str_cat("collective #", seq_, " (", what, "): MPI_Test failed: ", mpi_error_string(rc));
    throw Error(aborted_);
  }
  const std::string silent = silent_peers();
  aborted_ = detail::str_cat("collective #", seq_, " (", what, "): every rank arrived but the transfer did not finish "
                             "within ", seconds(timeout_), "; ",
                             silent.empty() ? "every rank still answers (the transfer itself is stuck)"
                                            : silent + " stopped answering after arriving (stopped, or stuck outside MPI)");
  throw Error(aborted_, ErrorKind::Timeout);
}

// Note [Naming the rank that stalls a transfer]
// Every rank arrived (the arrival tokens said so), so a transfer that does not finish has a rank that stopped
// after arriving (SIGSTOP, a debugger, a frozen node) or cannot move its data. The ranks still running time
// out too, each one timeout after the same arrival, within milliseconds of each other: each sends every peer
// one roll-call token (this collective's number) and listens for theirs for a grace period; the peers never
// heard from are the ones that stalled it. The grace is the timeout, at least 0.5 s (the other ranks' own
// timeouts run out within it) and at most 5 s; only then does this rank throw and announce its failure, so
// no running peer has left its wait, heard of the failure and skipped its roll call. The tokens and requests
// are left to the ending job, as an aborted collective's are.
std::string MpiComm::silent_peers() {
  struct RollCall {
    int64_t sent = 0;
    std::vector<int64_t> received;
    std::vector<MPI_Request> receives;
  };
  auto* call = new RollCall{seq_, std::vector<int64_t>(static_cast<size_t>(size_), -1), {}};
  call->receives.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Irecv(&call->received[peer], 1, MPI_INT64_T, peer, kRollCallTag, comm_, &call->receives[peer]);
    MPI_Request send = MPI_REQUEST_NULL;
    if (MPI_Isend(&call->sent, 1, MPI_INT64_T, peer, kRollCallTag, comm_, &send) == MPI_SUCCESS) {
      MPI_Request_free(&send);
    }
  }
  std::vector<bool> answered(static_cast<size_t>(size_), false);
  answered[rank_] = true;
  const auto grace = std::clamp(timeout_, std::chrono::milliseconds(500), std::chrono::milliseconds(5000));
  poll_until(std::chrono::steady_clock::now() + grace, [&] {
    bool all = true;
    for (int peer = 0; peer < size_; ++peer) {
      int done = 0;
      if (!answered[peer] && MPI_Test(&call->receives[peer], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[peer] = true;
      }
      all = all && answered[peer];
    }
    return all;
  });
  std::string silent;
  int count = 0;
  for (int peer = 0; peer < size_; ++peer) {
    if (!answered[peer]) silent += detail::str_cat(count++ == 0 ? "" : ", ", peer);
  }
  if (count == 0) {
    delete call;  // every request completed
    return "";
  }
  return detail::str_cat(count > 1 ? "ranks " : "rank ", silent);
}

void MpiComm::set_after_arrival_hook_for_testing(void (*hook)()) { after_arrival_hook = hook; }

namespace {

// MPI's counts are ints.
int checked_bytes(int64_t bytes, const char* collective, const std::string& what) {
  DPE_CHECK(bytes >= 0 && bytes <= std::numeric_limits<int>::max(), "MPI ", collective, " (", what, "): ", bytes,
            " bytes; expected 0 to 2^31 - 1");
  return static_cast<int>(bytes);
}

}  // namespace

void MpiComm::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op, const std::string& what) {
  check_not_aborted(what);
  DPE_CHECK(count >= 0, "MPI all_reduce (", what, "): count must be >= 0, got ", count);
  const MPI_Datatype type = mpi_type(dtype);
  DPE_CHECK(op != ReduceOp::Avg || dtype == DType::Float32 || dtype == DType::Float64,
            "MPI all_reduce (", what, "): Avg needs a floating dtype, got ", dtype_name(dtype));
  arrive(what, {count, static_cast<int64_t>(dtype), static_cast<int64_t>(op)}, "elements, dtype, op");
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto* bytes = static_cast<char*>(data);
  const int64_t piece = kPieceBytes / static_cast<int64_t>(element_size(dtype));
  for (int64_t begin = 0; begin < count; begin += piece) {
    const int n = static_cast<int>(std::min(piece, count - begin));
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bytes + begin * element_size(dtype), n, type, mpi_op(op), comm_, &request),
              "MPI_Iallreduce");
    wait(request, deadline, what);
  }
  if (op != ReduceOp::Avg) return;
  if (dtype == DType::Float32) {
    for (float* p = static_cast<float*>(data); p != static_cast<float*>(data) + count; ++p) *p /= static_cast<float>(size_);
  } else {
    for (double* p = static_cast<double*>(data); p != static_cast<double*>(data) + count; ++p) *p /= size_;
  }
}

void MpiComm::reduce_scatter_block(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                   const std::string& what) {
  check_not_aborted(what);
  DPE_CHECK(count >= 0 && count <= std::numeric_limits<int>::max(), "MPI reduce_scatter (", what, "): ", count,
            " elements per process; expected at most 2^31 - 1");
  const MPI_Datatype type = mpi_type(dtype);
  DPE_CHECK(op != ReduceOp::Avg, "MPI reduce_scatter (", what, "): Avg is the caller's; pass Sum");
  arrive(what, {count, static_cast<int64_t>(dtype), static_cast<int64_t>(op)}, "elements, dtype, op");
  if (count == 0) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), type, mpi_op(op), comm_, &request),
            "MPI_Ireduce_scatter_block");
  wait(request, std::chrono::steady_clock::now() + timeout_, what);
}

void MpiComm::all_gather(const void* send, void* recv, int64_t bytes, const std::string& what) {
  check_not_aborted(what);
  const int n = checked_bytes(bytes, "all_gather", what);
  arrive(what, {bytes}, "bytes");
  if (bytes == 0) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &request), "MPI_Iallgather");
  wait(request, std::chrono::steady_clock::now() + timeout_, what);
}

void MpiComm::gather(const void* send, void* recv, int64_t bytes, int root, const std::string& what) {
  rooted(MPI_Igather, "gather", send, recv, bytes, root, what);
}

void MpiComm::scatter(const void* send, void* recv, int64_t bytes, int root, const std::string& what) {
  rooted(MPI_Iscatter, "scatter", send, recv, bytes, root, what);
}

void MpiComm::rooted(RootedCall call, const char* name, const void* send, void* recv, int64_t bytes, int root,
                     const std::string& what) {
  check_not_aborted(what);
  const int n = checked_bytes(bytes, name, what);
  DPE_CHECK(root >= 0 && root < size_, "MPI ", name, " (", what, "): root ", root, " is out of range for ", size_,
            " processes");
  arrive(what, {bytes, root}, "bytes, root");
  if (bytes == 0) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(call(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_, &request), name);
  wait(request, std::chrono::steady_clock::now() + timeout_, what);
}

void MpiComm::all_to_all(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                         const std::vector<int64_t>& recv_bytes, const std::string& what) {
  check_not_aborted(what);
  DPE_CHECK(send_bytes.size() == static_cast<size_t>(size_) && recv_bytes.size() == static_cast<size_t>(size_),
            "MPI all_to_all (", what, "): ", send_bytes.size(), " send and ", recv_bytes.size(),
            " receive counts; expected one per process (", size_, ")");
  // Counts and displacements, in MPI's ints.
  std::vector<int> counts[2], offsets[2];
  for (int side = 0; side < 2; ++side) {
    int64_t total = 0;
    for (int64_t bytes : side == 0 ? send_bytes : recv_bytes) {
      offsets[side].push_back(checked_bytes(total, "all_to_all", what));
      counts[side].push_back(checked_bytes(bytes, "all_to_all", what));
      total += bytes;
    }
    checked_bytes(total, "all_to_all", what);
  }
  arrive(what, {}, "");
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(send, counts[0].data(), offsets[0].data(), MPI_BYTE, recv, counts[1].data(),
                           offsets[1].data(), MPI_BYTE, comm_, &request), "MPI_Ialltoallv");
  wait(request, std::chrono::steady_clock::now() + timeout_, what);
}

void MpiComm::broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  check_not_aborted(what);
  DPE_CHECK(bytes >= 0, "MPI broadcast (", what, "): bytes must be >= 0, got ", bytes);
  DPE_CHECK(root >= 0 && root < size_, "MPI broadcast (", what, "): root ", root, " is out of range for ", size_,
            " processes");
  arrive(what, {bytes, root}, "bytes, root");
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto* base = static_cast<char*>(data);
  for (int64_t begin = 0; begin < bytes; begin += kPieceBytes) {
    const int n = static_cast<int>(std::min(kPieceBytes, bytes - begin));
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(base + begin, n, MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    wait(request, deadline, what);
  }
}

void MpiComm::barrier(const std::string& what) {
  check_not_aborted(what);
  arrive(what, {}, "");
}

}  // namespace dpe::collectives
