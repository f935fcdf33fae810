// hscapture native CUDA copy path: one call per forward pass issues every copy of a capture.
//
// Why native: in an engine's scheduler thread each torch call of the copy path costs 7-18 us of
// Python/dispatcher CPU (stream switch, event record, view, copy_), several per block and span;
// the hook runs once per forward on the critical path. Here a whole capture is a handful of
// CUDA driver calls (~1 us each), made with the GIL held (none of them blocks: the ring is
// page-locked, so device-to-host copies are asynchronous DMA).
//
// The CUDA driver (libcuda.so.1) is loaded at run time with dlopen: the extension builds and
// imports on machines without CUDA, and there is exactly one driver per process, so the
// streams and events of the process's torch (cudaStream_t == CUstream, cudaEvent_t == CUevent)
// are valid here. The driver API leaves the CUDA runtime's per-thread "last error" alone, which
// PyTorch checks after its own kernel launches: a failure here can never be blamed on the
// engine's next kernel.
#pragma once

#include <cstdint>
#include <string>

namespace hsc::cuda {

// One 2D copy: `height` rows of `width` bytes, from `src` (row pitch `src_pitch`) to `dst`
// (row pitch `dst_pitch`). Sources are device addresses; destinations are device addresses
// (`pre`) or page-locked host addresses (`post`: the ring, registered with cudaHostRegister).
struct Copy2D {
    uint64_t dst, dst_pitch, src, src_pitch, width, height;
};

// True when libcuda.so.1 is loadable and exports every function this path uses; otherwise
// false and `why` says what is missing. Thread-safe, resolved once.
bool available(std::string* why);

// The capture sequence, in this order:
//   1. `pre` copies on `caller` (device-to-device snapshots of sources the engine may
//      overwrite after the forward: CUDA-graph output buffers; token ids are taken by the
//      caller before, with a torch kernel, never as 4-byte rows here);
//   2. `ready` recorded on `caller`, `side` made to wait for it (the side stream's copies start
//      only after the forward pass, and the snapshots, produced their sources);
//   3. `post` copies on `side` (device-to-host into the ring);
//   4. `done` recorded on `side` (the entry may be committed once it completed); `done` 0
//      records nothing (device-to-device copies only, `side` == `caller`: the caller's stream
//      order is all that orders what reads them; one driver call less).
// `context` (the sources' CUcontext: the one `event_create` returned for `ready`, made from
// the sources' allocation) is made current for the calls when it is not.
// Returns 0, or the first failing CUresult with `err` naming the call (nothing after it was
// issued; copies before it may be in flight, so the caller must treat the entry as failed and
// wait for `done` only if it was recorded: it was not).
int submit(uint64_t caller, uint64_t side, uint64_t ready, uint64_t done, uint64_t context,
           const Copy2D* pre, size_t n_pre, const Copy2D* post, size_t n_post, std::string* err);

// Events, created without timing (cheap to record) in the context that owns `context_ptr`'s
// allocation; `*context` receives that context, which every later call on the event makes
// current for its duration (so any thread may query or wait). 0 on success.
int event_create(uint64_t context_ptr, uint64_t* event, uint64_t* context, std::string* err);
int event_destroy(uint64_t event, uint64_t context);
// 1 completed, 0 still pending, <0 an error (-CUresult).
int event_query(uint64_t event, uint64_t context);
// Blocks the calling thread until `event` completed. 0 on success.
int event_synchronize(uint64_t event, uint64_t context, std::string* err);

}  // namespace hsc::cuda
