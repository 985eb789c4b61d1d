// Byte copies involving CUDA devices; the ordering contract is in core/cuda/cuda_copy.h.
//
// Note [device-to-device copy ordering]
// For logical devices src != dst (same or different GPUs):
//   src stream:  ... producer kernels ... record(ready)                       wait(done) ... later work
//   dst stream:  ... earlier work ...      wait(ready) copy record(done)      ... later work
// The copy runs on the destination stream after everything enqueued on both streams; later work on dst sees
// the data, and later work on src (which may reuse the source block via the caching allocator) waits for the
// copy to finish reading it. The host never blocks.
#include "core/cuda/cuda_copy.h"

#include <mutex>
#include <set>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"

namespace dpe::cuda {

namespace {

// A timing-free event recorded on `logical`'s stream. Destroying it before it completes is allowed: CUDA
// releases it once the device reaches it.
class RecordedEvent {
 public:
  explicit RecordedEvent(int logical) {
    DeviceGuard guard(logical);  // an event must be created on the device of the stream that records it
    DPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    DPE_CUDA_CHECK(cudaEventRecord(event_, stream(logical)));
  }
  ~RecordedEvent() { cudaEventDestroy(event_); }  // unchecked: a destructor must not throw
  RecordedEvent(const RecordedEvent&) = delete;
  RecordedEvent& operator=(const RecordedEvent&) = delete;

  // Work enqueued on `logical`'s stream from now on runs after the recorded point.
  void block(int logical) const {
    DeviceGuard guard(logical);
    DPE_CUDA_CHECK(cudaStreamWaitEvent(stream(logical), event_, 0));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// Lets physical GPU `dst` read `src`'s memory directly when the hardware allows it; once per ordered pair.
// Returns silently when it does not: cudaMemcpyPeerAsync then stages the copy through the host.
void enable_peer_access_once(int dst_physical, int src_physical) {
  static auto* mutex = new std::mutex;
  static auto* tried = new std::set<std::pair<int, int>>;
  std::lock_guard lock(*mutex);
  if (!tried->insert({dst_physical, src_physical}).second) return;
  int can_access = 0;
  DPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, dst_physical, src_physical));
  if (!can_access) return;
  int previous = -1;
  DPE_CUDA_CHECK(cudaGetDevice(&previous));
  DPE_CUDA_CHECK(cudaSetDevice(dst_physical));
  cudaError_t status = cudaDeviceEnablePeerAccess(src_physical, 0);
  cudaSetDevice(previous);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {  // enabled by someone else: fine
    cudaGetLastError();
    return;
  }
  DPE_CUDA_CHECK(status);
}

}  // namespace

// src: host, nbytes  dst: device dst_logical, nbytes
void copy_host_to_device(int dst_logical, void* dst, const void* src, size_t nbytes, bool synchronize) {
  if (nbytes == 0) return;
  cudaStream_t st = stream(dst_logical);
  DeviceGuard guard(dst_logical);
  DPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, st));
  if (synchronize) DPE_CUDA_CHECK(cudaStreamSynchronize(st));  // the host buffer may be reused when we return
}

// src: device src_logical, nbytes  dst: host, nbytes
void copy_device_to_host(void* dst, int src_logical, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  cudaStream_t st = stream(src_logical);
  DeviceGuard guard(src_logical);
  DPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, st));
  DPE_CUDA_CHECK(cudaStreamSynchronize(st));  // the host buffer may be read when we return
}

// src: device src_logical, nbytes  dst: device dst_logical, nbytes. Note [device-to-device copy ordering].
void copy_device_to_device(int dst_logical, void* dst, int src_logical, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  cudaStream_t dst_stream = stream(dst_logical);
  if (dst_logical == src_logical) {
    DeviceGuard guard(dst_logical);
    DPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, dst_stream));
    return;
  }
  int dst_physical = physical_device(dst_logical);
  int src_physical = physical_device(src_logical);
  if (dst_physical != src_physical) enable_peer_access_once(dst_physical, src_physical);

  RecordedEvent ready(src_logical);
  ready.block(dst_logical);
  {
    DeviceGuard guard(dst_logical);
    if (dst_physical == src_physical) {
      DPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, dst_stream));
    } else {
      DPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_physical, src, src_physical, nbytes, dst_stream));
    }
  }
  RecordedEvent done(dst_logical);
  done.block(src_logical);
}

}  // namespace dpe::cuda
