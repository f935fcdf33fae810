// Native CUDA copy path (see hscapture/cuda_copy.h). The driver API is declared here, the few
// types and functions used, with the ABI of cuda.h (CUDA_MEMCPY2D is the v2 struct, stable since
// CUDA 3.2), so no CUDA toolkit is needed to build.
#include "hscapture/cuda_copy.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace hsc::cuda {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUevent = void*;
using CUcontext = void*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr int CU_MEMORYTYPE_HOST = 1;
constexpr int CU_MEMORYTYPE_DEVICE = 2;
constexpr int CU_POINTER_ATTRIBUTE_CONTEXT = 1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;

struct Memcpy2D {  // CUDA_MEMCPY2D (v2)
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void* srcHost;
    CUdeviceptr srcDevice;
    void* srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void* dstHost;
    CUdeviceptr dstDevice;
    void* dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};

struct Driver {
    CUresult (*memcpy2d_async)(const Memcpy2D*, CUstream) = nullptr;
    CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
    CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
    CUresult (*event_record)(CUevent, CUstream) = nullptr;
    CUresult (*stream_wait_event)(CUstream, CUevent, unsigned) = nullptr;
    CUresult (*event_create)(CUevent*, unsigned) = nullptr;
    CUresult (*event_destroy)(CUevent) = nullptr;
    CUresult (*event_query)(CUevent) = nullptr;
    CUresult (*event_synchronize)(CUevent) = nullptr;
    CUresult (*pointer_attr)(void*, int, CUdeviceptr) = nullptr;
    CUresult (*ctx_get_current)(CUcontext*) = nullptr;
    CUresult (*ctx_push)(CUcontext) = nullptr;
    CUresult (*ctx_pop)(CUcontext*) = nullptr;
    CUresult (*error_name)(CUresult, const char**) = nullptr;
    std::string why;  // empty when every symbol resolved
};

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* why) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (!*out && why->empty()) *why = std::string("libcuda.so.1 has no ") + name;
    return *out != nullptr;
}

const Driver& driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        // The process's own driver if it is loaded (torch loaded it), else load it; never unloaded.
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) {
            const char* e = dlerror();
            d.why = std::string("cannot load libcuda.so.1: ") + (e ? e : "unknown error");
            return;
        }
        resolve(lib, "cuMemcpy2DAsync_v2", &d.memcpy2d_async, &d.why);
        resolve(lib, "cuMemcpyDtoHAsync_v2", &d.memcpy_dtoh_async, &d.why);
        resolve(lib, "cuMemcpyDtoDAsync_v2", &d.memcpy_dtod_async, &d.why);
        resolve(lib, "cuEventRecord", &d.event_record, &d.why);
        resolve(lib, "cuStreamWaitEvent", &d.stream_wait_event, &d.why);
        resolve(lib, "cuEventCreate", &d.event_create, &d.why);
        resolve(lib, "cuEventDestroy_v2", &d.event_destroy, &d.why);
        resolve(lib, "cuEventQuery", &d.event_query, &d.why);
        resolve(lib, "cuEventSynchronize", &d.event_synchronize, &d.why);
        resolve(lib, "cuPointerGetAttribute", &d.pointer_attr, &d.why);
        resolve(lib, "cuCtxGetCurrent", &d.ctx_get_current, &d.why);
        resolve(lib, "cuCtxPushCurrent_v2", &d.ctx_push, &d.why);
        resolve(lib, "cuCtxPopCurrent_v2", &d.ctx_pop, &d.why);
        resolve(lib, "cuGetErrorName", &d.error_name, &d.why);
    });
    return d;
}

void describe(const Driver& d, CUresult rc, const char* call, std::string* err) {
    const char* name = nullptr;
    if (d.error_name) d.error_name(rc, &name);
    if (err) *err = std::string(call) + " failed: " + (name ? name : "CUresult ") + " (" + std::to_string(rc) + ")";
}

// Makes `want` the current context of this thread for this scope (when it is not already).
class ContextScope {
public:
    ContextScope(const Driver& d, CUcontext want) : d_(d) {
        CUcontext cur = nullptr;
        rc_ = d.ctx_get_current(&cur);
        if (rc_ == CUDA_SUCCESS && cur != want) {
            rc_ = d.ctx_push(want);
            pushed_ = rc_ == CUDA_SUCCESS;
        }
    }
    ~ContextScope() {
        if (pushed_) {
            CUcontext popped = nullptr;
            d_.ctx_pop(&popped);
        }
    }
    CUresult rc() const { return rc_; }

private:
    const Driver& d_;
    CUresult rc_ = CUDA_SUCCESS;
    bool pushed_ = false;
};

// The driver is loaded and `*ctx` is the context that owns the allocation at `ptr`: 0, else the
// error (described in `err`).
CUresult source_context(const Driver& d, uint64_t ptr, CUcontext* ctx, std::string* err) {
    if (!d.why.empty()) {
        if (err) *err = d.why;
        return -1;
    }
    CUresult rc = d.pointer_attr(ctx, CU_POINTER_ATTRIBUTE_CONTEXT, CUdeviceptr(ptr));
    if (rc != CUDA_SUCCESS) describe(d, rc, "cuPointerGetAttribute (source context)", err);
    return rc;
}

// Deferred captures (see cuda_copy.h): the queue, in submission order, and the `done` events of
// captures whose flush failed (event -> CUresult, reported once). One mutex guards both;
// `flushed` wakes the waiters of event_synchronize.
struct Deferred {
    CUcontext context;
    CUstream side;
    CUevent ready, done;
    std::vector<Copy2D> post;
    std::chrono::steady_clock::time_point queued;
    // A capture a budgeted flush issued in part: the side stream's wait for `ready` is issued
    // (`started`), `post[0, next)` are issued, and `post[next]` is what is left of that copy
    // (its first rows or bytes issued: its addresses and height advanced in place).
    bool started = false;
    size_t next = 0;
};

struct DeferQueue {
    std::mutex mu;
    std::condition_variable flushed;
    std::vector<Deferred> queue;
    std::unordered_map<CUevent, CUresult> failed;
    std::chrono::nanoseconds max_age{std::chrono::milliseconds(200)};
};

DeferQueue& defer_queue() {
    static DeferQueue q;
    return q;
}

bool is_queued(const DeferQueue& q, CUevent ev) {
    for (const Deferred& x : q.queue)
        if (x.done == ev) return true;
    return false;
}

// One copy, with its memory kinds stated (`to_host`: into the page-locked ring, else device to
// device) rather than left for the driver to classify, as unified-address copies are. Dense
// rows (pitch == width on both sides, or one row) are one linear copy. Measured against the
// unified 2D copies and a per-call context lookup: no change in the submission's host time
// that the runs could resolve (benchmarks/results/h200-2026-12-02c).
CUresult copy(const Driver& d, const Copy2D& c, CUstream stream, bool to_host) {
    const size_t bytes = size_t(c.width) * size_t(c.height);
    if (c.height == 1 || (c.src_pitch == c.width && c.dst_pitch == c.width)) {
        return to_host ? d.memcpy_dtoh_async(reinterpret_cast<void*>(c.dst), CUdeviceptr(c.src), bytes, stream)
                       : d.memcpy_dtod_async(CUdeviceptr(c.dst), CUdeviceptr(c.src), bytes, stream);
    }
    Memcpy2D m{};
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    m.srcDevice = CUdeviceptr(c.src);
    m.srcPitch = size_t(c.src_pitch);
    if (to_host) {
        m.dstMemoryType = CU_MEMORYTYPE_HOST;
        m.dstHost = reinterpret_cast<void*>(c.dst);
    } else {
        m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        m.dstDevice = CUdeviceptr(c.dst);
    }
    m.dstPitch = size_t(c.dst_pitch);
    m.WidthInBytes = size_t(c.width);
    m.Height = size_t(c.height);
    return d.memcpy2d_async(&m, stream);
}

}  // namespace

CopySplit split_copy(const Copy2D& c, uint64_t budget) {
    const uint64_t bytes = c.width * c.height;
    if (budget == 0 || bytes <= budget) return CopySplit{c, Copy2D{}, true};
    Copy2D part = c, rest = c;
    if (c.height > 1) {
        // whole rows, at least one; fewer than c.height since bytes > budget
        part.height = std::max<uint64_t>(1, budget / c.width);
        rest.src += part.height * c.src_pitch;
        rest.dst += part.height * c.dst_pitch;
        rest.height -= part.height;
    } else {
        // one row (a linear copy): bytes, at least 1 MiB (a part that small is all overhead)
        part.width = std::max<uint64_t>(budget, MIN_SPLIT_BYTES);
        if (part.width >= c.width) return CopySplit{c, Copy2D{}, true};
        rest.src += part.width;
        rest.dst += part.width;
        rest.width -= part.width;
    }
    return CopySplit{part, rest, false};
}

bool available(std::string* why) {
    const Driver& d = driver();
    if (why) *why = d.why;
    return d.why.empty();
}

static CUresult issue_post(const Driver& d, CUstream ss, CUevent ready, CUevent done,
                           const Copy2D* post, size_t n_post, std::string* err);

int submit(uint64_t caller, uint64_t side, uint64_t ready, uint64_t done, uint64_t context,
           const Copy2D* pre, size_t n_pre, const Copy2D* post, size_t n_post, std::string* err,
           bool defer) {
    const Driver& d = driver();
    if (!d.why.empty()) {
        if (err) *err = d.why;
        return -1;
    }
    CUresult rc = CUDA_SUCCESS;
    ContextScope scope(d, reinterpret_cast<CUcontext>(context));
    if (scope.rc() != CUDA_SUCCESS) return describe(d, scope.rc(), "cuCtxPushCurrent", err), scope.rc();
    auto cs = reinterpret_cast<CUstream>(caller);
    auto ss = reinterpret_cast<CUstream>(side);
    for (size_t i = 0; i < n_pre; ++i)
        if ((rc = copy(d, pre[i], cs, false)) != CUDA_SUCCESS) return describe(d, rc, "cuMemcpy(2D)Async (snapshot)", err), rc;
    // The side stream waits for everything the caller's stream has enqueued so far (the forward
    // pass and the snapshots above): stream order is the only ordering the copies rely on.
    // When they are one stream (a staged snapshot: no device-to-host part) that order holds
    // already, and the record + self-wait would be two driver calls doing nothing.
    if (ss != cs) {
        if ((rc = d.event_record(reinterpret_cast<CUevent>(ready), cs)) != CUDA_SUCCESS)
            return describe(d, rc, "cuEventRecord (ready)", err), rc;
        if (defer && done != 0) {
            // Queued: the wait below, the copies and `done` are issued by flush_deferred. The
            // wait then uses `ready`'s latest record, which is this one or a later one of the
            // same stream (a superset: still after the captured point).
            DeferQueue& q = defer_queue();
            std::lock_guard<std::mutex> lock(q.mu);
            q.queue.push_back(Deferred{reinterpret_cast<CUcontext>(context), ss,
                                       reinterpret_cast<CUevent>(ready), reinterpret_cast<CUevent>(done),
                                       std::vector<Copy2D>(post, post + n_post),
                                       std::chrono::steady_clock::now()});
            q.failed.erase(reinterpret_cast<CUevent>(done));
            return 0;
        }
        if ((rc = d.stream_wait_event(ss, reinterpret_cast<CUevent>(ready), 0)) != CUDA_SUCCESS)
            return describe(d, rc, "cuStreamWaitEvent", err), rc;
    }
    return issue_post(d, ss, nullptr, reinterpret_cast<CUevent>(done), post, n_post, err);
}

// Steps 2-4 of a capture: the side stream's wait for `ready` (when given), the copies into the
// ring, `done` (when not 0). The caller made the sources' context current.
static CUresult issue_post(const Driver& d, CUstream ss, CUevent ready, CUevent done,
                           const Copy2D* post, size_t n_post, std::string* err) {
    CUresult rc = CUDA_SUCCESS;
    if (ready != nullptr && (rc = d.stream_wait_event(ss, ready, 0)) != CUDA_SUCCESS)
        return describe(d, rc, "cuStreamWaitEvent", err), rc;
    for (size_t i = 0; i < n_post; ++i)
        if ((rc = copy(d, post[i], ss, true)) != CUDA_SUCCESS) return describe(d, rc, "cuMemcpy(2D)Async (to the ring)", err), rc;
    if (done != nullptr && (rc = d.event_record(done, ss)) != CUDA_SUCCESS)
        return describe(d, rc, "cuEventRecord (done)", err), rc;
    return CUDA_SUCCESS;
}

namespace {

// Issues the part of `c` that fits `budget` bytes on `ss` (to the ring) and leaves what is left
// of it in `c` (split_copy); `*all`: nothing is left. `*issued` grows by what was issued.
CUresult copy_part(const Driver& d, Copy2D& c, CUstream ss, uint64_t budget, uint64_t* issued,
                   bool* all) {
    const CopySplit s = split_copy(c, budget);
    *all = s.all;
    *issued += s.part.width * s.part.height;
    if (!s.all) c = s.rest;
    return copy(d, s.part, ss, true);
}

// Issues queued captures, in order; the caller holds q.mu. `budget` (bytes; 0: no bound): once
// this call issued that many bytes of copies it stops, leaving the rest of a capture (a copy
// split between rows) and the captures after it queued for the next call; a capture queued for
// `max_age / 2` or longer is issued whole regardless (a budget below the rate captures come in
// never holds one back for long). A capture whose every copy is issued gets its `done`
// recorded and leaves the queue (that is the count returned). A capture that fails is reported
// through its `done` (q.failed), leaves the queue, and the flush goes on with the next one.
int flush_locked(const Driver& d, DeferQueue& q, std::string* err, CUevent after = nullptr,
                 uint64_t budget = 0) {
    int first_rc = 0, n = 0;
    uint64_t issued = 0;
    const auto now = std::chrono::steady_clock::now();
    size_t gone = 0;                  // q.queue[0, gone) issued whole or failed
    for (; gone < q.queue.size(); ++gone) {
        Deferred& x = q.queue[gone];
        const bool whole = budget == 0 || now - x.queued >= q.max_age / 2;
        if (!whole && issued >= budget) break;
        ContextScope scope(d, x.context);
        CUresult rc = scope.rc();
        std::string why;
        bool all = true;
        if (rc != CUDA_SUCCESS) describe(d, rc, "cuCtxPushCurrent", &why);
        // `after` (the engine's read-back done): the side stream also waits for it, so what
        // this call issues starts only once that read-back completed, never level with it.
        else if (after != nullptr && (rc = d.stream_wait_event(x.side, after, 0)) != CUDA_SUCCESS)
            describe(d, rc, "cuStreamWaitEvent (after)", &why);
        else if (!x.started && (rc = d.stream_wait_event(x.side, x.ready, 0)) != CUDA_SUCCESS)
            describe(d, rc, "cuStreamWaitEvent", &why);
        else {
            x.started = true;
            for (; x.next < x.post.size(); ++x.next) {
                if (!whole && issued >= budget) {
                    all = false;
                    break;
                }
                rc = copy_part(d, x.post[x.next], x.side, whole ? 0 : budget - issued, &issued, &all);
                if (rc != CUDA_SUCCESS) {
                    describe(d, rc, "cuMemcpy(2D)Async (to the ring)", &why);
                    break;
                }
                if (!all) break;      // the rest of this copy waits for the next call
            }
            if (rc == CUDA_SUCCESS && all && (rc = d.event_record(x.done, x.side)) != CUDA_SUCCESS)
                describe(d, rc, "cuEventRecord (done)", &why);
        }
        if (rc != CUDA_SUCCESS) {
            q.failed[x.done] = rc;
            if (first_rc == 0) {
                first_rc = rc;
                if (err) *err = why;
            }
            continue;
        }
        if (!all) break;              // issued in part: it stays first in the queue
        ++n;
    }
    q.queue.erase(q.queue.begin(), q.queue.begin() + gone);
    q.flushed.notify_all();
    return first_rc != 0 ? -first_rc : n;
}

}  // namespace

int flush_deferred(std::string* err, uint64_t after_event, uint64_t max_bytes) {
    const Driver& d = driver();
    if (!d.why.empty()) return 0;          // nothing can have been queued
    DeferQueue& q = defer_queue();
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.queue.empty()) return 0;
    return flush_locked(d, q, err, reinterpret_cast<CUevent>(after_event), max_bytes);
}

void set_defer_max_age_ns(uint64_t ns) {
    DeferQueue& q = defer_queue();
    std::lock_guard<std::mutex> lock(q.mu);
    q.max_age = std::chrono::nanoseconds(ns);
}

size_t deferred_count() {
    DeferQueue& q = defer_queue();
    std::lock_guard<std::mutex> lock(q.mu);
    return q.queue.size();
}

int event_create(uint64_t context_ptr, uint64_t* event, uint64_t* context, std::string* err) {
    const Driver& d = driver();
    CUcontext ctx = nullptr;
    CUresult rc = source_context(d, context_ptr, &ctx, err);
    if (rc != CUDA_SUCCESS) return rc;
    ContextScope scope(d, ctx);
    if (scope.rc() != CUDA_SUCCESS) return describe(d, scope.rc(), "cuCtxPushCurrent", err), scope.rc();
    CUevent ev = nullptr;
    if ((rc = d.event_create(&ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
        return describe(d, rc, "cuEventCreate", err), rc;
    *event = reinterpret_cast<uint64_t>(ev);
    *context = reinterpret_cast<uint64_t>(ctx);
    return 0;
}

int event_destroy(uint64_t event, uint64_t context) {
    const Driver& d = driver();
    if (!d.why.empty()) return -1;
    ContextScope scope(d, reinterpret_cast<CUcontext>(context));
    return scope.rc() != CUDA_SUCCESS ? scope.rc() : d.event_destroy(reinterpret_cast<CUevent>(event));
}

// The CUresult of `ev`'s failed deferred issue, removed (reported once); CUDA_SUCCESS if none.
// The caller holds q.mu.
static CUresult take_failure(DeferQueue& q, CUevent ev) {
    auto it = q.failed.find(ev);
    if (it == q.failed.end()) return CUDA_SUCCESS;
    CUresult rc = it->second;
    q.failed.erase(it);
    return rc;
}

// A `done` still queued, or whose deferred issue failed: `*rc` is CUDA_ERROR_NOT_READY
// (pending) or the CUresult, reported once; false for any other event.
static bool deferred_state(uint64_t event, CUresult* rc) {
    DeferQueue& q = defer_queue();
    std::lock_guard<std::mutex> lock(q.mu);
    auto ev = reinterpret_cast<CUevent>(event);
    *rc = is_queued(q, ev) ? CUDA_ERROR_NOT_READY : take_failure(q, ev);
    return *rc != CUDA_SUCCESS;
}

int event_query(uint64_t event, uint64_t context) {
    const Driver& d = driver();
    if (!d.why.empty()) return -1;
    CUresult deferred = CUDA_SUCCESS;
    if (deferred_state(event, &deferred)) return deferred == CUDA_ERROR_NOT_READY ? 0 : -deferred;
    ContextScope scope(d, reinterpret_cast<CUcontext>(context));
    if (scope.rc() != CUDA_SUCCESS) return -scope.rc();
    CUresult rc = d.event_query(reinterpret_cast<CUevent>(event));
    if (rc == CUDA_SUCCESS) return 1;
    if (rc == CUDA_ERROR_NOT_READY) return 0;
    return -rc;
}

int event_synchronize(uint64_t event, uint64_t context, std::string* err) {
    const Driver& d = driver();
    if (!d.why.empty()) {
        if (err) *err = d.why;
        return -1;
    }
    {
        // A queued capture: wait for the engine's flush, or flush once the oldest queued
        // capture is max_age old.
        DeferQueue& q = defer_queue();
        std::unique_lock<std::mutex> lock(q.mu);
        auto ev = reinterpret_cast<CUevent>(event);
        while (is_queued(q, ev)) {
            auto due = q.queue.front().queued + q.max_age;
            if (std::chrono::steady_clock::now() >= due) {
                std::string ignored;   // a failure is reported per event, just below
                flush_locked(d, q, &ignored);
                break;
            }
            q.flushed.wait_until(lock, due);
        }
        if (CUresult rc = take_failure(q, ev); rc != CUDA_SUCCESS) {
            describe(d, rc, "deferred capture copy", err);
            return rc;
        }
    }
    ContextScope scope(d, reinterpret_cast<CUcontext>(context));
    if (scope.rc() != CUDA_SUCCESS) return describe(d, scope.rc(), "cuCtxPushCurrent", err), scope.rc();
    CUresult rc = d.event_synchronize(reinterpret_cast<CUevent>(event));
    if (rc != CUDA_SUCCESS) describe(d, rc, "cuEventSynchronize", err);
    return rc;
}

}  // namespace hsc::cuda
