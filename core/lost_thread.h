// Lost device threads: a device worker that never finishes its task (stuck in a kernel or a wait that does
// not return) cannot be killed, so the engine declares it lost and goes on without it
// (engine/worker_pool.h, "straggler timeout"). The thread is left where it is. Should its kernel ever
// return, it must not go on into what the engine has since freed or rebuilt (the step's locals, a new
// process group): it stops at its next checkpoint and parks there for good (sleeps until the process
// exits), keeping alive only what its own stack holds.
//
// Checkpoints: the end of every kernel dispatch (core/dispatch.h), every collective of a ProcessGroup (on entry,
// after its first meeting, on return: collectives/process_group.cc), each autograd node of a backward pass
// (core/autograd/backward.cc), and the engine's step tasks after every phase that runs a model (forward,
// loss, backward) before they write their results. Contract for code that runs on a device worker: between
// a call that may block for long and a write to anything the task does not own, pass a checkpoint.
//
// Thread-safety: each worker thread installs its own flag (a pointer, thread-local); the flag itself is an
// atomic the pool sets from the thread that declares the worker lost.
#pragma once

#include <atomic>
#include <cstdint>

namespace dpe {

namespace detail {
extern thread_local const std::atomic<bool>* t_lost_flag;
[[noreturn]] void park_lost_thread();
}  // namespace detail

// Installs `flag` as this thread's "lost" flag (the worker pool, once per worker thread); nullptr clears it.
void set_thread_lost_flag(const std::atomic<bool>* flag);

// Parks this thread for good if it is a worker that was declared lost; otherwise returns at once.
inline void checkpoint_if_lost() {
  const std::atomic<bool>* flag = detail::t_lost_flag;
  if (flag != nullptr && flag->load(std::memory_order_acquire)) detail::park_lost_thread();
}

// Lost threads that have reached a checkpoint and parked there (tests).
int64_t parked_lost_threads();

}  // namespace dpe
