// Byte copies that involve a CUDA device. Ordering contract: a copy is enqueued after all work already
// enqueued on the streams of the devices involved, and work enqueued later on those streams runs after it.
// Host<->device copies return when the host side may be reused/read (they synchronize the stream), except a
// host-to-device copy with synchronize = false: it is only enqueued, and the caller keeps the host buffer
// alive and unchanged until the stream has passed it (core/pinned_memory.h does that for pinned blocks).
#pragma once

#include <cstddef>

namespace dpe::cuda {

void copy_host_to_device(int dst_logical, void* dst, const void* src, size_t nbytes, bool synchronize = true);
void copy_device_to_host(void* dst, int src_logical, const void* src, size_t nbytes);
// Same logical device: on its stream. Different logical devices: the destination stream waits for the
// source stream (event), copies (peer access when available, cudaMemcpyPeerAsync otherwise, which stages
// through the host), and the source stream then waits for the copy, so the source block is not reused early.
void copy_device_to_device(int dst_logical, void* dst, int src_logical, const void* src, size_t nbytes);

}  // namespace dpe::cuda
