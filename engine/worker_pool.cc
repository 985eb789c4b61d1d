#include "engine/worker_pool.h"

#include <omp.h>
#include <sched.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "core/amp/autocast.h"
#include "core/autograd/grad_mode.h"
#include "core/cpu_cores.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/kernels/matmul.h"
#include "core/spin_wait.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

std::vector<std::vector<int>> parse_cpu_device_cores(const std::string& text) {
  const std::vector<int> allowed = usable_cpus();
  std::vector<std::vector<int>> cores;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(';', begin), text.size());
    const std::string entry = text.substr(begin, end - begin);
    std::vector<int>& mine = cores.emplace_back();
    size_t item = 0;
    while (item < entry.size()) {
      const size_t comma = std::min(entry.find(',', item), entry.size());
      int core = -1;
      const char* first = entry.data() + item;
      const char* last = entry.data() + comma;
      auto [ptr, ec] = std::from_chars(first, last, core);
      DPE_CHECK(ec == std::errc() && ptr == last && core >= 0 && core < CPU_SETSIZE, "DPE_CPU_DEVICE_CORES='", text,
                "': entry ", cores.size() - 1, " ('", entry, "', for cpu:", cores.size() - 1,
                ") is not a comma list of core numbers; expected e.g. 0;0;0;1");
      DPE_CHECK(std::binary_search(allowed.begin(), allowed.end(), core), "DPE_CPU_DEVICE_CORES='", text, "': core ",
                core, " (for cpu:", cores.size() - 1, ") is not one this process may run on (its affinity mask has ",
                allowed.size(), " CPUs, from ", allowed.front(), " to ", allowed.back(), ")");
      mine.push_back(core);
      item = comma + 1;
    }
    if (end == text.size()) break;
    begin = end + 1;
  }
  return cores;
}

std::vector<int> pinned_cpu_device_cores(const Device& device) {
  const char* env = std::getenv("DPE_CPU_DEVICE_CORES");
  if (!device.is_cpu() || env == nullptr || *env == '\0') return {};
  std::vector<std::vector<int>> pinned = parse_cpu_device_cores(env);
  return static_cast<size_t>(device.index) < pinned.size() ? pinned[static_cast<size_t>(device.index)]
                                                           : std::vector<int>{};
}

namespace {

// Runs `fn` and returns the exception it threw, if any. A template, not a std::function: wrapping the
// worker's lambda would allocate outside the try, and a bad_alloc there ends the worker thread in
// std::terminate.
template <typename F>
std::exception_ptr capture(F&& fn) {
  try {
    fn();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc& ex) {
    return std::string("out of memory (") + ex.what() + ") in an allocation outside dpe's allocators";
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// Note [Lost workers]
// With a straggler timeout, run() waits for the workers still running at most that long after the first
// worker of the run finished; those still running then are declared lost (their flag, which is also their
// thread's core/lost_thread.h flag), reported as failures, and left behind. A lost worker never runs again
// (run() refuses it), and its thread is detached, not joined, when the pool goes. A lost worker must never
// outlive what it uses; what makes sure of it:
//  - a worker declared lost before it took its task never takes it (has_task is cleared with the flag);
//  - run() does not return at once: it gives the workers it declared lost kLostGrace to get out of the way,
//    i.e. to end (their task returned: a healthy worker only slower than the timeout, which a millisecond
//    --timeout on a loaded machine makes common, or one woken by the collectives' abort) or to park at a
//    lost-thread checkpoint. Only a worker still inside a call that blocks (a kernel that does not return, a
//    wait) is left behind running, and every such call is followed by a checkpoint (core/lost_thread.h; the
//    collectives are checkpoints too), so when it returns it parks before it touches anything else;
//  - the thread shares Impl (a shared_ptr), so the state it reads outlives the pool; if its task ever
//    returns, the worker sees the flag under the mutex and ends without touching the run (its task fields
//    point into a caller that may be gone);
//  - what the blocked call itself still uses (the replica's module and gradients, an optimizer, a reducer's
//    buckets, a process group, which a group never reopens while the worker may be inside: Note [A member
//    that leaves early] in collectives/process_group.cc) the caller keeps alive for good, never frees or
//    reuses (ReplicaSet::retire, engine/replica_set.h).
// Parking is not seen here (a parked thread never returns), so a worker that parks costs run() the whole
// grace; that happens only on the way to a failure.

// How long run() waits for the workers it declares lost to end (Note [Lost workers]): far longer than a thread
// that is merely preempted waits for a core, and short next to the straggler timeouts a real device needs.
constexpr std::chrono::milliseconds kLostGrace{1000};

// Note [A run allocates nothing]
// run() hands out its work as pointers and plain values (Impl's task fields, Worker::has_task), never as a
// std::function built per task: that would allocate once the pool's state says a run is under way, and out
// of memory there would leave workers holding a task that refers to a caller already gone (run() throwing
// with `pending` set), or end a worker in std::terminate. From the state change to the return nothing
// allocates but the ReplicaError that reports a failure (worker_pool_test counts on it, failing every
// allocation during a run).
struct DeviceWorkerPool::Impl {
  struct Worker {
    Device device;
    std::vector<int> cores;  // $DPE_CPU_DEVICE_CORES's entry for this CPU device: pinned there; empty: not
    std::thread thread;
    size_t index = 0;
    bool has_task = false;  // set by run(), cleared by the worker when it takes the task
    bool running = false;   // set by run(), cleared by the worker when its task has returned
    std::atomic<bool> lost{false};  // declared lost by run() (Note [Lost workers]); never cleared
    bool awaited = false;  // declared lost by the current run(), which waits for it to end (kLostGrace)
    bool ended = false;    // lost, and its task has returned since: its thread has ended
    std::exception_ptr error;
    uint64_t failure_order = 0;  // this run's failures are numbered 0, 1, ... in the order they happened
  };

  std::vector<Device> devices;
  std::vector<std::unique_ptr<Worker>> workers;
  int cpu_threads = 1;
  int64_t threads_created = 0;

  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  // generation, pending and stopping change under the mutex only; they are atomic so that a thread may spin
  // on them before it blocks (core/spin_wait.h).
  std::atomic<uint64_t> generation{0};  // bumped by each run(); a worker runs its task once per generation
  std::atomic<size_t> pending{0};
  size_t finished = 0;      // workers of this run whose task has returned
  std::chrono::steady_clock::time_point first_finished_at;  // when the first of them did
  std::chrono::milliseconds straggler_timeout{0};
  // How long waits spin before they block (core/spin_wait.h): a worker's wait for its next task, and run()'s
  // for the workers. run()'s caller is one thread more: it spins only when it, too, can have a core of its
  // own, since otherwise it spins on a core a worker needs and delays that worker until it yields
  // (docs/BENCHMARKS.md, "The pool's hand-over").
  std::chrono::microseconds spin{0};
  std::chrono::microseconds caller_spin{0};
  std::atomic<bool> stopping{false};
  uint64_t failures = 0;                 // failures numbered so far in this run
  // This run's task (Note [A run allocates nothing]): the caller's objects, alive until run() returns.
  const std::function<void(size_t)>* fn = nullptr;
  const FailureCallback* on_failure = nullptr;
  bool grad_enabled = true;
  amp::AutocastState autocast;

  // One run's task as a worker copied it (under the mutex: a worker declared lost must not read the run's
  // fields again while a later run() sets them).
  struct Task {
    const std::function<void(size_t)>* fn = nullptr;
    const FailureCallback* on_failure = nullptr;
    bool grad_enabled = true;
    amp::AutocastState autocast;
  };

  void loop(Worker& w) {
    set_thread_lost_flag(&w.lost);
    std::unique_ptr<tbb::task_arena> arena = enter_device(w);
    uint64_t seen = 0;
    Task task;
    while (take_task(w, seen, task)) {
      // pending counts this worker until the end of the iteration (unless it is declared lost), so run() has
      // not returned and everything the task fields point to is alive.
      std::exception_ptr error = capture([&] { run_task(w, task, arena.get()); });
      if (!finish_task(w, task, std::move(error))) return;
    }
  }

  // The worker's CPU share: its cores (pinned) or cpu_threads intra-op threads, in its own oneTBB arena (null:
  // oneTBB's default arena).
  std::unique_ptr<tbb::task_arena> enter_device(const Worker& w) const {
    if (!w.device.is_cpu()) return nullptr;
    const int threads = w.cores.empty() ? cpu_threads : static_cast<int>(w.cores.size());
    if (!w.cores.empty()) pin_this_thread(w.cores);  // checked cores: it cannot fail usefully
    omp_set_num_threads(threads);
    try {
      return std::make_unique<tbb::task_arena>(threads);
    } catch (const std::bad_alloc&) {
      // Out of memory before the first task: run tasks in oneTBB's default arena (correct, only not limited
      // to this device's share of the cores) rather than end the thread with std::terminate.
      return nullptr;
    }
  }

  // Waits for the next run's task (returns false when the pool stops) and copies its fields.
  bool take_task(Worker& w, uint64_t& seen, Task& task) {
    std::unique_lock lock(mutex);
    if (!stopping && generation == seen) {
      lock.unlock();
      spin_until([&] { return stopping.load(std::memory_order_acquire) ||
                              generation.load(std::memory_order_acquire) != seen; },
                 spin);
      lock.lock();
    }
    work_ready.wait(lock, [&] { return stopping || (generation != seen && w.has_task); });
    if (stopping) return false;
    seen = generation;
    w.has_task = false;
    task = Task{.fn = fn, .on_failure = on_failure, .grad_enabled = grad_enabled, .autocast = autocast};
    return true;
  }

  static void run_task(const Worker& w, const Task& task, tbb::task_arena* arena) {
    auto body = [&] {
      GradMode::set_enabled(task.grad_enabled);
      // The caller's autocast for this task; the worker's cast cache is emptied when it ends, however.
      amp::set_autocast_state(task.autocast);
      struct AutocastReset {
        ~AutocastReset() { amp::set_autocast_state({}); }
      } reset;
      (*task.fn)(w.index);
    };
#if DPE_WITH_CUDA
    std::unique_ptr<cuda::DeviceGuard> guard;
    if (w.device.is_cuda()) guard = std::make_unique<cuda::DeviceGuard>(w.device.index);
#endif
    if (arena) {
      arena->execute(body);
    } else {
      body();
    }
  }

  // Records the task's end (and its error) for run(); returns false when the worker was declared lost while
  // the task ran: run() has returned without it, and the task fields point into a caller that is gone, so
  // it touches nothing and its thread ends (Note [Lost workers]).
  bool finish_task(Worker& w, const Task& task, std::exception_ptr error) {
    {
      std::lock_guard lock(mutex);
      if (w.lost) {
        w.ended = true;
        work_done.notify_all();  // run() may be waiting for it (Note [Lost workers])
        return false;
      }
      w.running = false;
      if (finished++ == 0) first_finished_at = std::chrono::steady_clock::now();
      if (error) w.failure_order = failures++;
    }
    if (error && *task.on_failure) {
      try {
        (*task.on_failure)(w.index, error);
      } catch (...) {
      }
    }
    std::lock_guard lock(mutex);
    w.error = std::move(error);
    if (--pending == 0) work_done.notify_all();
    return true;
  }

  // Waits until every worker of the run has returned, or, with a straggler timeout, until the workers still
  // running straggler_timeout after the first one finished are declared lost.
  void wait_for_workers(std::unique_lock<std::mutex>& lock, size_t count) {
    if (straggler_timeout.count() <= 0 || count < 2) {
      work_done.wait(lock, [&] { return pending == 0; });
      return;
    }
    // Woken only when the run is done, not per finished worker (that would cost a context switch per worker
    // and step): between those, run() looks at least once per straggler_timeout, and once a worker has
    // finished it sleeps exactly until that worker's deadline.
    while (pending > 0) {
      const auto now = std::chrono::steady_clock::now();
      const bool stragglers = finished > 0 && finished < count;  // some returned, some still run their task
      if (stragglers && now >= first_finished_at + straggler_timeout) break;
      work_done.wait_until(lock, (stragglers ? first_finished_at : now) + straggler_timeout,
                           [&] { return pending == 0; });
    }
    if (pending == 0) return;
    for (size_t i = 0; i < count; ++i) {
      Worker& w = *workers[i];
      if (!w.running) continue;
      w.lost.store(true, std::memory_order_release);
      w.running = false;
      // Not started yet (its thread has not woken since run() handed it the task): it never will, since the
      // task fields are cleared when run() returns, and a later run() would set them to another caller's task.
      const bool started = !w.has_task;
      w.has_task = false;
      w.awaited = started;  // one that never started has nothing to get out of
      w.failure_order = failures++;
      w.error = std::make_exception_ptr(Error(detail::str_cat(
          "did not finish within ", straggler_timeout.count(), " ms of the first device that did (stuck in a "
          "kernel or a wait?): the device is lost, its thread left behind"), ErrorKind::DeviceLost));
      --pending;
    }
    work_done.wait(lock, [&] { return pending == 0; });  // those that finished meanwhile
    // The lost ones: until they end or the grace is over (Note [Lost workers]). Those that park use it all.
    auto lost_ended = [&] {
      for (size_t i = 0; i < count; ++i) {
        if (workers[i]->awaited && !workers[i]->ended) return false;
      }
      return true;
    };
    work_done.wait_until(lock, std::chrono::steady_clock::now() + kLostGrace, lost_ended);
    for (size_t i = 0; i < count; ++i) workers[i]->awaited = false;
  }
};

DeviceWorkerPool::DeviceWorkerPool(std::vector<Device> devices, int cpu_threads,
                                   std::chrono::milliseconds straggler_timeout)
    : impl_(std::make_shared<Impl>()) {
  DPE_CHECK(!devices.empty(), "DeviceWorkerPool: no devices");
  DPE_CHECK(straggler_timeout.count() >= 0, "DeviceWorkerPool: straggler_timeout must not be negative, got ",
            straggler_timeout.count(), " ms");
  impl_->straggler_timeout = straggler_timeout;
  impl_->devices = std::move(devices);
  int cpu_devices = static_cast<int>(
      std::count_if(impl_->devices.begin(), impl_->devices.end(), [](const Device& d) { return d.is_cpu(); }));
  const int cores = usable_cores();
  impl_->spin = spin_budget(static_cast<int>(impl_->devices.size()), cores);
  impl_->caller_spin = spin_budget(static_cast<int>(impl_->devices.size()) + 1, cores);
  impl_->cpu_threads = cpu_threads > 0 ? cpu_threads : std::max(1, cpu_devices > 0 ? cores / cpu_devices : 1);
  if (cpu_devices > 0) kernels::prepare_cpu_gemm();  // before any worker allocates (core/kernels/matmul.h)
  for (const Device& d : impl_->devices) {
    auto worker = std::make_unique<Impl::Worker>();
    worker->device = d;
    worker->cores = pinned_cpu_device_cores(d);
    worker->index = impl_->workers.size();
    impl_->workers.push_back(std::move(worker));
  }
  for (auto& worker : impl_->workers) {
    Impl::Worker* w = worker.get();
    try {
      // The thread shares the pool's state: a lost worker's thread may outlive the pool (Note [Lost workers]).
      w->thread = std::thread([impl = impl_, w] { impl->loop(*w); });
    } catch (...) {
      // Creating a thread fails (std::system_error, EAGAIN) when memory or the thread limit runs out. Stop the
      // workers already started: destroying their joinable std::threads would call std::terminate.
      {
        std::lock_guard lock(impl_->mutex);
        impl_->stopping = true;
      }
      impl_->work_ready.notify_all();
      for (auto& started : impl_->workers) {
        if (started->thread.joinable()) started->thread.join();
      }
      throw;
    }
    ++impl_->threads_created;
  }
}

DeviceWorkerPool::~DeviceWorkerPool() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->work_ready.notify_all();
  for (auto& w : impl_->workers) {
    if (w->lost) {
      w->thread.detach();
    } else {
      w->thread.join();
    }
  }
}

size_t DeviceWorkerPool::size() const { return impl_->workers.size(); }
const std::vector<Device>& DeviceWorkerPool::devices() const { return impl_->devices; }
int64_t DeviceWorkerPool::threads_created() const { return impl_->threads_created; }
int DeviceWorkerPool::cpu_threads_per_device() const { return impl_->cpu_threads; }

std::vector<size_t> DeviceWorkerPool::lost_workers() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<size_t> lost;
  for (const auto& w : impl_->workers) {
    if (w->lost) lost.push_back(w->index);
  }
  return lost;
}

bool DeviceWorkerPool::has_lost_workers() const {
  std::lock_guard lock(impl_->mutex);
  for (const auto& w : impl_->workers) {
    if (w->lost) return true;
  }
  return false;
}

void DeviceWorkerPool::run(size_t count, const std::function<void(size_t replica)>& fn,
                           const FailureCallback& on_failure) {
  DPE_CHECK(count <= size(), "DeviceWorkerPool::run: ", count, " replicas for ", size(), " workers");
  if (count == 0) return;
  for (size_t i = 0; i < count; ++i) {
    DPE_CHECK(!impl_->workers[i]->lost, "DeviceWorkerPool::run: the worker of ", impl_->devices[i], " (replica ", i,
              ") was lost in an earlier run (its task never finished); a lost device does not run again");
  }
  {
    std::unique_lock lock(impl_->mutex);
    DPE_INTERNAL_ASSERT(impl_->pending == 0, "DeviceWorkerPool::run is not reentrant");
    ++impl_->generation;
    impl_->pending = count;
    impl_->finished = 0;
    impl_->failures = 0;
    impl_->fn = &fn;
    impl_->on_failure = &on_failure;
    impl_->grad_enabled = GradMode::is_enabled();
    impl_->autocast = amp::autocast_state();
    for (size_t i = 0; i < count; ++i) {
      impl_->workers[i]->error = nullptr;
      impl_->workers[i]->has_task = true;
      impl_->workers[i]->running = true;
    }
  }
  impl_->work_ready.notify_all();
  spin_until([&] { return impl_->pending.load(std::memory_order_acquire) == 0; }, impl_->caller_spin);
  std::unique_lock lock(impl_->mutex);
  impl_->wait_for_workers(lock, count);
  impl_->fn = nullptr;
  impl_->on_failure = nullptr;
  std::vector<Impl::Worker*> failed;
  for (size_t i = 0; i < count; ++i) {
    if (impl_->workers[i]->error) failed.push_back(impl_->workers[i].get());
  }
  if (failed.empty()) return;
  std::sort(failed.begin(), failed.end(), [](auto* a, auto* b) { return a->failure_order < b->failure_order; });
  std::vector<ReplicaError::Failure> later;
  for (size_t k = 1; k < failed.size(); ++k) {
    later.push_back({static_cast<int>(failed[k]->index), failed[k]->device, message_of(failed[k]->error),
                     error_kind_of(failed[k]->error)});
  }
  std::string message = message_of(failed[0]->error);
  const ErrorKind kind = error_kind_of(failed[0]->error);
  for (Impl::Worker* w : failed) w->error = nullptr;
  throw ReplicaError(static_cast<int>(failed[0]->index), failed[0]->device, message, std::move(later), kind);
}

}  // namespace dpe
