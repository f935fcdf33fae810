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

// A budgeted flush's split of one copy (flush_deferred's max_bytes): `part`, the first at most
// `budget` bytes of `c` (0: no bound) in whole rows, at least one; a one-row copy splits between
// bytes, at least MIN_SPLIT_BYTES; and `rest`, what follows it (its addresses advanced past
// `part`), unless `all` (`part` is `c`). The parts a copy splits into, one after the other,
// cover exactly its bytes, in order.
struct CopySplit {
    Copy2D part, rest;
    bool all;
};
constexpr uint64_t MIN_SPLIT_BYTES = uint64_t(1) << 20;
CopySplit split_copy(const Copy2D& c, uint64_t budget);

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
           const Copy2D* pre, size_t n_pre, const Copy2D* post, size_t n_post, std::string* err,
           bool defer = false);

// Deferred device-to-host copies. Every device-to-host copy of the process goes through one
// copy engine in the order it was issued, whatever its stream: a capture's tens of MB issued
// inside a forward pass are ahead of the engine's own few-KB result read-back of that pass,
// which then waits for them (benchmarks/bench_copy_contention.py: 0.57 ms behind 40 MB, 5.6 ms
// behind 320 MB, on an H200). With `defer`, `submit` issues the snapshots and records `ready`
// at once (the point in the caller's stream the copies must follow) and QUEUES steps 2-4 (the
// side stream's wait, the `post` copies, `done`); `flush_deferred` issues every queued one, in
// order: the engine adapter calls it once the engine has issued its own read-back (SGLang: at
// the next scheduling step). Until then `event_query(done)` says "pending", and
// `event_synchronize(done)` waits for the flush, or flushes itself once the oldest queued
// capture is `max_age_ns` old (a stalled engine never holds a capture forever). A flush that
// fails reports its CUresult through the query / synchronize of each `done` it did not issue.
// `done` must be a distinct event per queued capture (each capture takes its own from a pool).
// `after_event` (0: none): an event recorded behind the engine's own read-back (SGLang's
// `copy_done`); every flushed capture's side stream waits for it too. Why: the deferred copies
// and that read-back wait for the same forward's end; whichever the copy engine takes first,
// the other waits, so without this the read-back could still wait behind them.
// `max_bytes` (0: no bound): a flush that has issued that many bytes of copies stops there,
// between two rows of a copy if need be, and the next flush goes on from that point (a capture
// queued for max_age / 2 or longer is issued whole regardless). Why: the engine's read-back
// waits behind whatever is queued in the copy engine; a drain of several passes' captures
// issued at one step (~270 MB at SGLang's 1B shape, ~5 ms of the copy engine) could delay the
// read-backs of the next passes, where spread over steps it stays ahead of them.
int flush_deferred(std::string* err, uint64_t after_event = 0, uint64_t max_bytes = 0);
void set_defer_max_age_ns(uint64_t ns);
// How many captures are queued now.
size_t deferred_count();

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
