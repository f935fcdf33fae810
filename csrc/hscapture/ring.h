// hscapture shared-memory ring: producer and consumer cores (no Python in here).
//
// Hot-path operations (reserve, poll, commit, release) return status codes; only cold-path
// failures (attach, create, corruption, misuse) throw RingException, which the binding turns
// into the typed errors of `hscapture.errors`.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <deque>
#include <mutex>
#include <vector>

#include "hscapture/layout.h"

namespace hsc {

// One kind per Python class of hscapture.errors (plus ValueError for bad arguments).
enum class ErrorKind {
    Ring,
    SegmentExists,
    SegmentNotFound,
    SegmentPermission,
    LayoutMismatch,
    EpochMismatch,
    OutOfSpace,
    RecordTooLarge,
    RingFull,
    ConsumerSlotsExhausted,
    SubscriptionNotFound,
    SubscriptionInUse,
    Value,
};

const char* error_class_name(ErrorKind kind);

class RingException : public std::runtime_error {
public:
    RingException(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
    ErrorKind kind() const { return kind_; }

private:
    ErrorKind kind_;
};

// A MAP_SHARED mapping plus the file descriptor it came from. Shared (shared_ptr) between the
// Producer/Consumer and every payload view handed out, so the memory stays mapped until the
// last view dies even if the owner was closed.
struct Mapping {
    int fd = -1;
    uint8_t* base = nullptr;
    std::size_t size = 0;
    // Only in a ThreadSanitizer build (HSC_SHARE_MAPPINGS_IN_PROCESS): a consumer in the same
    // process as the producer reuses the producer's mapping (so TSan sees one address per
    // byte) and keeps it alive here; `base` is then not ours to unmap.
    std::shared_ptr<Mapping> alias_of;
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
};

// reserve() status codes (a position is always >= 0)
constexpr int64_t RESERVE_FULL = -1;
constexpr int64_t RESERVE_TOO_LARGE = -2;

// poll() / take() status codes
enum class PollStatus { Record, Empty, TooSmall };

struct RecordView {
    uint64_t position = 0;
    uint64_t end = 0;
    uint64_t seq = 0;
    uint64_t epoch = 0;
    uint64_t tag = 0;
    uint64_t payload_len = 0;
    uint8_t* payload = nullptr;
};

struct ProducerStats {
    uint64_t committed, reserved, aborted, full_count, control_full, reaped, expired, min_released,
        live_consumers, detached_durable, expired_slots, head, next_seq;
};

// How a slot scan treats dead consumers.
enum class ScanMode {
    Reserve,  // free dead anonymous slots, expire dead durable ones, that block this reservation
    ReapAll,  // free every dead anonymous slot (never touches durable slots)
    Peek,     // change nothing
};

class Producer {
public:
    // control_reserve: bytes every data reservation must leave free for control reservations
    // (< capacity / 2).
    Producer(const std::string& name, uint64_t capacity, uint32_t max_consumers, uint64_t epoch,
             uint64_t control_reserve = 0);
    ~Producer();
    Producer(const Producer&) = delete;
    Producer& operator=(const Producer&) = delete;

    // Never blocks. Returns the record position, RESERVE_FULL or RESERVE_TOO_LARGE. A data
    // reservation (control=false) succeeds only if `control_reserve` bytes stay free after it;
    // a control reservation may use the whole ring.
    int64_t reserve(uint64_t payload_len, uint64_t tag, bool control = false);
    void commit(uint64_t position);
    void abort(uint64_t position);
    // reserve() + a copy of src[0:len] into the payload + commit(), the record published whole
    // by one store of head (a consumer never sees it RESERVED). Holds the producer's lock through
    // the copy. Returns the position, RESERVE_FULL (nothing written) or RESERVE_TOO_LARGE.
    int64_t put(const void* src, uint64_t len, uint64_t tag, bool control = false);
    uint8_t* payload(uint64_t position, uint64_t* payload_len);
    uint64_t record_seq(uint64_t position);
    // Publish that every sample number below `n` is taken (the header's `taken`; monotonic:
    // a smaller value is a no-op). The caller serializes its calls (hscapture's capture lock).
    void store_taken(uint64_t n);
    int reap();
    // 0 (default): a durable slot whose owner is dead or detached bounds the producer forever.
    // > 0: once such a slot has blocked reservations for this long, it is EXPIRED (bounds
    // nothing; a consumer resuming it is told the range it lost).
    void set_durable_expiry_ns(uint64_t ns) { durable_expiry_ns_.store(ns, std::memory_order_relaxed); }
    uint64_t durable_expiry_ns() const { return durable_expiry_ns_.load(std::memory_order_relaxed); }
    // DEPRECATED no-op (layout 3 replaced the grace period by durable slots + durable_expiry_ns):
    // the value is stored and returned, and has no effect.
    void set_dead_consumer_grace_ns(uint64_t ns) { dead_grace_ns_.store(ns, std::memory_order_relaxed); }
    uint64_t dead_consumer_grace_ns() const { return dead_grace_ns_.load(std::memory_order_relaxed); }
    ProducerStats stats();
    void close(bool unlink);
    bool closed() const { return !map_; }

    const std::string& name() const { return name_; }
    uint64_t epoch() const { return epoch_; }
    uint64_t capacity() const { return capacity_; }
    uint64_t control_reserve() const { return control_reserve_; }
    uint64_t head() const { return head_; }
    const std::shared_ptr<Mapping>& mapping() const { return map_; }
    uint8_t* data() const { return data_; }

private:
    layout::RecordHeader* checked_record(uint64_t position, const char* op);
    uint64_t scan_consumers(uint64_t end_eff, ScanMode mode, int* reaped);
    bool expiry_due(uint32_t slot, uint64_t word, uint64_t expiry_ns);
    void require_open(const char* op) const;
    void write_padding(uint64_t p, uint64_t off, uint64_t pad);
    int64_t place_locked(uint64_t payload_len, bool control, uint64_t* end_out);
    layout::RecordHeader* write_header_locked(uint64_t pos, uint64_t payload_len, uint64_t tag, uint32_t state);

    std::string name_;
    uint64_t epoch_ = 0;
    uint64_t capacity_ = 0;
    uint64_t control_reserve_ = 0;
    uint32_t max_consumers_ = 0;
    int64_t owner_pid_ = 0;  // the process that opened it: a forked child's close gives nothing back
    std::shared_ptr<Mapping> map_;
    layout::SegmentHeader* hdr_ = nullptr;
    layout::ConsumerSlot* slots_ = nullptr;
    uint8_t* data_ = nullptr;
    uint64_t head_ = 0;   // producer-local copy of hdr_->head (single writer)
    uint64_t limit_ = 0;  // cached min released of live consumers at the last scan
    uint64_t seq_ = 0;
    std::atomic<uint64_t> durable_expiry_ns_{0};  // set from any thread
    std::atomic<uint64_t> dead_grace_ns_{0};      // deprecated, no effect
    // Records reserved but not yet committed/aborted, in reservation order. Their bytes may
    // still be in flight (an async GPU copy), so the producer never laps over the oldest one,
    // whether or not any consumer is attached. Guarded by mu_, as is every producer-local field:
    // commit() may run on another thread than reserve().
    std::deque<std::pair<uint64_t, bool>> inflight_;
    std::mutex mu_;
    void settle_locked(uint64_t position);
    void finish(uint64_t position, uint32_t state, std::atomic<uint64_t> layout::SegmentHeader::*counter,
                const char* op);
    // per slot: the state word of a durable slot first seen dead/detached while blocking a
    // reservation, and when (CLOCK_MONOTONIC ns; producer-local)
    std::vector<std::pair<uint64_t, uint64_t>> dead_since_;
};

class Consumer {
public:
    // resume_name empty: an anonymous consumer (close() frees its slot; when it dies the
    // producer frees the slot as soon as it needs the space).
    // resume_name non-empty: a durable subscription. If a slot under that name exists (its
    // owner detached or dead), take it over at its released position (or, if it EXPIRED, at
    // the current head, reporting the lost range); else register a new slot under the name,
    // unless resume_only (then throw SubscriptionNotFound and create nothing). A live owner of
    // the name makes this throw SubscriptionInUse.
    Consumer(const std::string& name, uint64_t expected_epoch, const std::string& resume_name = "",
             bool resume_only = false);
    ~Consumer();
    Consumer(const Consumer&) = delete;
    Consumer& operator=(const Consumer&) = delete;

    PollStatus poll(RecordView* out);
    // poll() + copy of the payload into dst[0:payload_len] + release() of the record, in one
    // call (a consumer that copies records out). TooSmall: payload_len > capacity, nothing
    // copied, and the record stays the next one poll()/take() returns; `out` says its size.
    // `out->payload` is never valid after a Record return (the space is released).
    PollStatus take(uint8_t* dst, uint64_t capacity, RecordView* out);
    void release(uint64_t position);
    bool producer_alive() const;
    // Anonymous: frees the slot. Durable: DETACHES (drops the lock and the mapping; the slot
    // stays ACTIVE with its name and released position, so the producer keeps everything from
    // there on). Idempotent.
    void close();
    // Frees the slot for good (durable or not); the consumer is closed afterwards.
    void unsubscribe();
    bool closed() const { return !map_; }

    const std::string& name() const { return name_; }
    uint64_t epoch() const { return epoch_; }
    uint64_t capacity() const { return capacity_; }
    uint32_t slot() const { return slot_; }
    uint64_t position() const { return position_; }
    uint64_t released() const { return released_; }
    bool resumed() const { return resumed_; }
    bool durable() const { return !resume_name_.empty(); }
    const std::string& resume_name() const { return resume_name_; }
    uint64_t attached_at() const { return attached_at_; }
    // Durable slots: 1 + the record sequence number through which every sample was
    // acknowledged in order (0: none), as the slot holds it (a resumer reads the previous
    // owner's value); store_delivered keeps it monotonic (a smaller value is a no-op).
    uint64_t delivered() const;
    void store_delivered(uint64_t value);
    // Durable slots: 1 + the lowest record sequence number below which a resumer may skip a
    // chunk that continues a sample it never saw start, capped by `delivered` (0: no cap);
    // what it means is the subscriber's (hscapture/_source.py). Not monotonic.
    uint64_t unsettled() const;
    void store_unsettled(uint64_t value);
    // Durable: 1 + the highest sample number of an entry this place's owners read (0: none,
    // or a segment of an older build), as the slot holds it (a resumer reads the previous
    // owner's value); store_read_through keeps it monotonic. Store it before releasing the
    // records it covers.
    uint64_t read_through() const;
    void store_read_through(uint64_t value);
    bool expired() const { return expired_; }
    uint64_t lost_from() const { return lost_from_; }
    uint64_t lost_to() const { return lost_to_; }
    uint64_t head() const;
    // The producer's `taken` (layout.h): every sample number below it was taken.
    uint64_t taken() const;
    uint8_t* data() const { return data_; }
    const std::shared_ptr<Mapping>& mapping() const { return map_; }

private:
    void require_open(const char* op) const;
    void store_released(uint64_t position);
    bool resume_locked(layout::ConsumerSlot* slots, uint32_t n);
    void register_locked(layout::ConsumerSlot* slots, uint32_t n);
    uint64_t register_protocol(layout::ConsumerSlot& s, uint64_t word);
    void release_slot(bool free_it);

    std::string name_;
    std::string resume_name_;
    uint64_t epoch_ = 0;
    uint64_t capacity_ = 0;
    int64_t owner_pid_ = 0;  // the process that attached: a forked child's close gives nothing back
    std::shared_ptr<Mapping> map_;
    layout::SegmentHeader* hdr_ = nullptr;
    layout::ConsumerSlot* my_slot_ = nullptr;
    uint8_t* data_ = nullptr;
    uint32_t slot_ = 0;
    uint64_t my_word_ = 0;  // our slot's state word while we own it
    uint64_t position_ = 0;
    uint64_t released_ = 0;
    uint64_t last_end_ = 0;  // end of the last record poll() returned
    // The last value of the segment's head poll() acquire-loaded: headers below it are visible
    // (head only grows in an epoch), so poll() re-reads the producer's head line only once it
    // has caught up with this value, not at every record.
    uint64_t head_seen_ = 0;
    uint64_t attached_at_ = 0;
    uint64_t lost_from_ = 0, lost_to_ = 0;
    bool resumed_ = false;
    bool expired_ = false;
};

// --- segment-level helpers (cold path) ---------------------------------------------------------
struct SlotInfo {
    uint32_t slot, state, generation;
    uint64_t released, pid, attached_at;
    bool alive, durable;
    std::string name;  // "" for FREE and anonymous slots
};
struct SegmentInfo {
    std::string name;
    uint64_t magic, epoch, capacity, head, map_size, data_offset, producer_pid, created_ns, control_reserve;
    uint32_t layout_version, max_consumers;
    bool producer_alive;
    uint64_t committed, reserved, aborted, full_count, control_full, reaped, expired, next_seq, taken;
    std::vector<SlotInfo> consumers;
};

bool is_stale(const std::string& name);
void unlink_segment(const std::string& name);
// Maps only the header and slots, read-only; never takes a lock or changes a slot.
SegmentInfo segment_info(const std::string& name);

}  // namespace hsc
