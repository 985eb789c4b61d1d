#include "collectives/mpi_backend.h"

#include <cstring>

#include "core/copy.h"
#include "core/error.h"

namespace dpe::collectives {

MpiBackend::MpiBackend(std::vector<Device> devices, std::chrono::milliseconds timeout)
    : SharedMemoryBackend(std::move(devices)) {
  const ProcessPlace& place = MpiWorld::get().place();
  processes_ = place.size;
  process_index_ = place.rank;
  // The cross communicators pair member t of every process: each process needs the same count.
  MpiComm world(timeout);
  int64_t extremes[2] = {size(), -size()};  // max of the counts, minus their min
  world.all_reduce(extremes, 2, DType::Int64, ReduceOp::Max, "ProcessGroup construction: members per process");
  DPE_CHECK(extremes[0] == size() && -extremes[1] == size(), "ProcessGroup 'mpi': every process must bring the "
            "same number of devices; process ", process_index_, " of ", processes_, " on ", place.host, " has ",
            size(), ", and the processes have between ", -extremes[1], " and ", extremes[0]);
  failures_ = std::make_unique<MpiAbortChannel>();
  for (int t = 0; t < size(); ++t) cross_.push_back(std::make_unique<MpiComm>(timeout, failures_.get()));
  staging_.resize(static_cast<size_t>(size()));
}

Tensor MpiBackend::on_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor host = Tensor::empty(t.shape(), TensorOptions(t.dtype()).with_pinned_memory(true));
  copy_into(host, t);
  return host;
}

Tensor MpiBackend::host_buffer(int64_t count, DType dtype, int rank) const {
  return Tensor::empty({count}, TensorOptions(dtype).with_pinned_memory(!devices_[rank].is_cpu()));
}

void MpiBackend::back_to_device(const Tensor& t, const Tensor& host) {
  if (!t.device().is_cpu()) copy_into(t, host);
}

void MpiBackend::append_bytes(std::vector<uint8_t>& bytes, const Tensor& t) {
  const Tensor host = on_host(t);
  const auto* begin = static_cast<const uint8_t*>(host.data_ptr());
  bytes.insert(bytes.end(), begin, begin + host.nbytes());
}

void MpiBackend::assign_bytes(const Tensor& t, const uint8_t* from) {
  if (t.numel() == 0) return;
  Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), TensorOptions(t.dtype()).with_pinned_memory(true));
  std::memcpy(host.data_ptr(), from, host.nbytes());
  back_to_device(t, host);
}

namespace {

// Checked before a member touches any buffer: every member sees the same arguments and throws alike.
void check_reducible(const char* collective, DType dtype, ReduceOp op) {
  const bool floating = dtype == DType::Float32 || dtype == DType::Float64;
  DPE_CHECK(floating || dtype == DType::Int32 || dtype == DType::Int64, "ProcessGroup 'mpi': ", collective, " of ",
            dtype_name(dtype), " is not supported across processes (float32, float64, int32, int64)");
  DPE_CHECK(floating || op != ReduceOp::Avg, "ProcessGroup 'mpi': ", collective, " with avg needs a floating "
            "dtype, got ", dtype_name(dtype));
}

}  // namespace

void MpiBackend::all_reduce(int rank, const PostedAll& posted) {
  const Tensor& tensor = posted[rank]->tensor;
  const ReduceOp op = posted[rank]->op;
  const DType dtype = tensor.dtype();
  check_reducible("all_reduce", dtype, op);
  std::vector<Tensor> shares = share_of_every_tensor(rank, posted);
  const ReduceOp combined = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const std::string what = detail::str_cat("all_reduce, member ", rank);
  // An empty share still meets the other processes: their arrival tokens compare the counts.
  if (shares.empty()) return cross_[rank]->all_reduce(nullptr, 0, dtype, combined, what);
  Tensor& mine = shares[rank];
  combine(rank, {mine}, shares, combined);
  const Tensor host = on_host(mine);
  cross_[rank]->all_reduce(host.data_ptr(), host.numel(), dtype, combined, what);
  back_to_device(mine, host);
  if (op == ReduceOp::Avg) mine.mul_(1.0 / static_cast<double>(processes_ * size()));
  for (int k = 0; k < size(); ++k) {
    if (k != rank) copy(shares[k], mine);
  }
}

void MpiBackend::broadcast(int rank, const PostedAll& posted) {
  const int root = posted[rank]->root;  // global
  const int root_process = root / size(), root_member = root % size();
  const Tensor& tensor = posted[rank]->tensor;
  if (process_index_ == root_process) copy(tensor, posted[root_member]->tensor);
  const Tensor host = on_host(tensor);
  cross_[rank]->broadcast(host.data_ptr(), static_cast<int64_t>(host.nbytes()), root_process,
                          detail::str_cat("broadcast, member ", rank));
  back_to_device(tensor, host);
}

void MpiBackend::gather_mine(int rank, const PostedAll& posted,
                             const std::function<Tensor(const Posted&, int64_t)>& slot) {
  const Tensor& input = posted[rank]->tensor;
  const int64_t n = input.numel();  // 0 too: the other processes' tokens compare the sizes
  const Tensor sent = on_host(input);
  const Tensor received = host_buffer(processes_ * n, input.dtype(), rank);
  cross_[rank]->all_gather(sent.data_ptr(), received.data_ptr(), static_cast<int64_t>(sent.nbytes()),
                           detail::str_cat("all_gather, member ", rank));
  for (int p = 0; p < processes_; ++p) {
    const Tensor piece = flat_slice(received, p * n, (p + 1) * n);
    for (const Posted* member : posted) copy(slot(*member, static_cast<int64_t>(p) * size() + rank), piece);
  }
}

void MpiBackend::all_gather(int rank, const PostedAll& posted) {
  gather_mine(rank, posted, [](const Posted& member, int64_t g) { return member.list[g]; });
}

void MpiBackend::all_gather_into_tensor(int rank, const PostedAll& posted) {
  const int64_t n = posted[rank]->tensor.numel();
  gather_mine(rank, posted, [n](const Posted& member, int64_t g) { return flat_slice(member.flat, g * n, (g + 1) * n); });
}

void MpiBackend::scatter_mine(int rank, const PostedAll& posted,
                              const std::function<Tensor(const Posted&, int64_t)>& slot) {
  Tensor output = posted[rank]->tensor;  // a handle: mul_ below writes the member's tensor
  const ReduceOp op = posted[rank]->op;
  check_reducible("reduce_scatter", output.dtype(), op);
  const ReduceOp combined = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const int64_t n = output.numel();
  Tensor blocks = Tensor::empty({processes_ * n}, TensorOptions(output.dtype()).with_device(devices_[rank]));
  for (int p = 0; p < processes_; ++p) {
    const int64_t g = static_cast<int64_t>(p) * size() + rank;
    std::vector<Tensor> inputs;
    for (const Posted* member : posted) inputs.push_back(slot(*member, g));
    if (n > 0) combine(rank, {flat_slice(blocks, p * n, (p + 1) * n)}, inputs, combined);
  }
  const Tensor sent = on_host(blocks);
  const Tensor received = host_buffer(n, output.dtype(), rank);
  cross_[rank]->reduce_scatter_block(sent.data_ptr(), received.data_ptr(), n, output.dtype(), combined,
                                     detail::str_cat("reduce_scatter, member ", rank));
  copy(output, received);
  if (op == ReduceOp::Avg) output.mul_(1.0 / static_cast<double>(processes_ * size()));
}

void MpiBackend::reduce_scatter(int rank, const PostedAll& posted) {
  scatter_mine(rank, posted, [](const Posted& member, int64_t g) { return member.list[g]; });
}

void MpiBackend::reduce_scatter_tensor(int rank, const PostedAll& posted) {
  const int64_t n = posted[rank]->tensor.numel();
  scatter_mine(rank, posted, [n](const Posted& member, int64_t g) { return flat_slice(member.flat, g * n, (g + 1) * n); });
}

void MpiBackend::reduce(int rank, const PostedAll& posted) {
  const int root = posted[rank]->root;  // global
  const ReduceOp op = posted[rank]->op;
  check_reducible("reduce", posted[rank]->tensor.dtype(), op);
  const ReduceOp combined = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const std::vector<Tensor> shares = share_of_every_tensor(rank, posted);
  const Tensor& tensor = posted[rank]->tensor;
  // Into a copy: only the root's tensor may change.
  Tensor result = Tensor::empty({shares.empty() ? 0 : shares[0].numel()},
                                TensorOptions(tensor.dtype()).with_device(devices_[rank]));
  if (!shares.empty()) combine(rank, {result}, shares, combined);
  const Tensor host = on_host(result);
  cross_[rank]->all_reduce(host.data_ptr(), host.numel(), tensor.dtype(), combined,
                           detail::str_cat("reduce, member ", rank));
  if (shares.empty() || process_index_ != root / size()) return;
  back_to_device(result, host);
  if (op == ReduceOp::Avg) result.mul_(1.0 / static_cast<double>(processes_ * size()));
  copy(shares[root % size()], result);
}

void MpiBackend::gather(int rank, const PostedAll& posted) {
  const int root = posted[rank]->root;  // global
  const int root_process = root / size();
  const Tensor& input = posted[rank]->tensor;
  const int64_t bytes = static_cast<int64_t>(input.nbytes());
  std::vector<uint8_t> sent, received;
  append_bytes(sent, input);
  if (process_index_ == root_process) received.resize(static_cast<size_t>(processes_ * bytes));
  cross_[rank]->gather(sent.data(), received.data(), bytes, root_process, detail::str_cat("gather, member ", rank));
  if (process_index_ != root_process) return;
  const std::vector<Tensor>& outputs = posted[root % size()]->list;
  for (int p = 0; p < processes_; ++p) assign_bytes(outputs[p * size() + rank], received.data() + p * bytes);
}

void MpiBackend::scatter(int rank, const PostedAll& posted) {
  const int root = posted[rank]->root;  // global
  const int root_process = root / size();
  const Tensor& output = posted[rank]->tensor;
  std::vector<uint8_t> sent, received(output.nbytes());
  if (process_index_ == root_process) {
    for (int p = 0; p < processes_; ++p) append_bytes(sent, posted[root % size()]->list[p * size() + rank]);
  }
  cross_[rank]->scatter(sent.data(), received.data(), static_cast<int64_t>(output.nbytes()), root_process,
                        detail::str_cat("scatter, member ", rank));
  assign_bytes(output, received.data());
}

namespace {

// all_to_all's table of one process: for each of its members, the element count and dtype of every input,
// then of every output (4 x world entries per member).
std::vector<int64_t> size_table(const PostedAll& posted) {
  std::vector<int64_t> table;
  for (const Posted* member : posted) {
    for (const std::vector<Tensor>* list : {&member->list, &member->list2}) {
      for (const Tensor& t : *list) {
        table.push_back(t.numel());
        table.push_back(static_cast<int64_t>(t.dtype()));
      }
    }
  }
  return table;
}

}  // namespace

void MpiBackend::all_to_all(int rank, const PostedAll& posted) {
  const std::string what = detail::str_cat("all_to_all, member ", rank);
  const int members = size(), world = processes_ * members;
  // Every member of every process gets every process's table and checks every pair the same way.
  const std::vector<int64_t> mine = size_table(posted);
  std::vector<int64_t> tables(mine.size() * static_cast<size_t>(processes_));
  cross_[rank]->all_gather(mine.data(), tables.data(), static_cast<int64_t>(mine.size() * sizeof(int64_t)), what);
  // Entry of global rank g's input (side 0) or output (side 1) for global rank k: {count, dtype}.
  auto entry = [&](int g, int side, int k) { return &tables[((static_cast<size_t>(g) * 2 + side) * world + k) * 2]; };
  for (int receiver = 0; receiver < world; ++receiver) {
    for (int sender = 0; sender < world; ++sender) {
      const int64_t* out = entry(receiver, 1, sender);
      const int64_t* in = entry(sender, 0, receiver);
      DPE_CHECK(out[0] == in[0] && out[1] == in[1], "all_to_all: global rank ", receiver, "'s output for global rank ",
                sender, " has ", out[0], " ", dtype_name(static_cast<DType>(out[1])), " elements, but global rank ",
                sender, "'s input for it has ", in[0], " ", dtype_name(static_cast<DType>(in[1])),
                " elements; expected the same count and dtype");
    }
  }
  // To process q: every local member's input for global rank q·T + rank; from process q: this member's
  // outputs of q's members, in member order.
  std::vector<uint8_t>& sent = staging_[rank].sent;
  std::vector<uint8_t>& received = staging_[rank].received;
  sent.clear();
  std::vector<int64_t> send_bytes(processes_), recv_bytes(processes_);
  for (int q = 0; q < processes_; ++q) {
    const size_t before = sent.size();
    for (const Posted* member : posted) append_bytes(sent, member->list[q * members + rank]);
    send_bytes[q] = static_cast<int64_t>(sent.size() - before);
    for (int j = 0; j < members; ++j) recv_bytes[q] += static_cast<int64_t>(posted[rank]->list2[q * members + j].nbytes());
  }
  int64_t total = 0;
  for (int64_t b : recv_bytes) total += b;
  received.resize(static_cast<size_t>(total));
  cross_[rank]->all_to_all(sent.data(), send_bytes, received.data(), recv_bytes, what);
  const uint8_t* from = received.data();
  for (const Tensor& output : posted[rank]->list2) {
    assign_bytes(output, from);
    from += output.nbytes();
  }
}

std::vector<uint8_t> MpiBackend::broadcast_object(int rank, const PostedAll& posted) {
  const int root = posted[rank]->root;  // global
  const int root_process = root / size();
  const std::string what = detail::str_cat("broadcast_object, member ", rank);
  std::vector<uint8_t> bytes;
  if (process_index_ == root_process) bytes = posted[root % size()]->bytes;
  int64_t count = static_cast<int64_t>(bytes.size());
  cross_[rank]->broadcast(&count, sizeof count, root_process, what);
  bytes.resize(static_cast<size_t>(count));
  cross_[rank]->broadcast(bytes.data(), count, root_process, what);
  return bytes;
}

void MpiBackend::barrier(int rank) { cross_[rank]->barrier(detail::str_cat("barrier, member ", rank)); }

std::unique_ptr<Backend> make_mpi_backend(const std::vector<Device>& devices, std::chrono::milliseconds timeout) {
  return std::make_unique<MpiBackend>(devices, timeout);
}

}  // namespace dpe::collectives
