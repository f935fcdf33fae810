// hscapture shared-memory ring: producer and consumer cores (no Python in here).
//
// Hot-path operations (reserve, poll, commit, release) return status codes; only cold-path
// failures (attach, create, corruption, misuse) throw RingException, which the binding turns
// into the typed errors of `hscapture.errors`.
#pragma once

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
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
};

// reserve() status codes (a position is always >= 0)
constexpr int64_t RESERVE_FULL = -1;
constexpr int64_t RESERVE_TOO_LARGE = -2;

// poll() status codes
enum class PollStatus { Record, Empty };

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
    uint64_t committed, reserved, aborted, full_count, reaped, min_released, live_consumers, head,
        next_seq;
};

class Producer {
public:
    Producer(const std::string& name, uint64_t capacity, uint32_t max_consumers, uint64_t epoch);
    ~Producer();
    Producer(const Producer&) = delete;
    Producer& operator=(const Producer&) = delete;

    // Never blocks. Returns the record position, RESERVE_FULL or RESERVE_TOO_LARGE.
    int64_t reserve(uint64_t payload_len, uint64_t tag);
    void commit(uint64_t position);
    void abort(uint64_t position);
    uint8_t* payload(uint64_t position, uint64_t* payload_len);
    uint64_t record_seq(uint64_t position);
    int reap();
    // A dead consumer's slot is kept (its unread records stay) for this long after the producer
    // first needs its space, so a consumer restarted under the same resume name can take over.
    void set_dead_consumer_grace_ns(uint64_t ns) { dead_grace_ns_ = ns; }
    uint64_t dead_consumer_grace_ns() const { return dead_grace_ns_; }
    ProducerStats stats();
    void close(bool unlink);
    bool closed() const { return !map_; }

    const std::string& name() const { return name_; }
    uint64_t epoch() const { return epoch_; }
    uint64_t capacity() const { return capacity_; }
    uint64_t head() const { return head_; }
    const std::shared_ptr<Mapping>& mapping() const { return map_; }
    uint8_t* data() const { return data_; }

private:
    layout::RecordHeader* checked_record(uint64_t position, const char* op);
    uint64_t scan_consumers(uint64_t end, bool reap_all, int* reaped, uint32_t* live);
    bool grace_expired(uint32_t slot, uint64_t word);
    void require_open(const char* op) const;
    void write_padding(uint64_t p, uint64_t off, uint64_t pad);

    std::string name_;
    uint64_t epoch_ = 0;
    uint64_t capacity_ = 0;
    uint32_t max_consumers_ = 0;
    std::shared_ptr<Mapping> map_;
    layout::SegmentHeader* hdr_ = nullptr;
    layout::ConsumerSlot* slots_ = nullptr;
    uint8_t* data_ = nullptr;
    uint64_t head_ = 0;   // producer-local copy of hdr_->head (single writer)
    uint64_t limit_ = 0;  // cached min released of live consumers at the last scan
    uint64_t seq_ = 0;
    uint64_t dead_grace_ns_ = 0;
    // Records reserved but not yet committed/aborted, in reservation order. Their bytes may
    // still be in flight (an async GPU copy), so the producer never laps over the oldest one,
    // whether or not any consumer is attached. Guarded by mu_, as is every producer-local field:
    // commit() may run on another thread than reserve().
    std::deque<std::pair<uint64_t, bool>> inflight_;
    std::mutex mu_;
    void settle_locked(uint64_t position);
    void finish(uint64_t position, uint32_t state, std::atomic<uint64_t> layout::SegmentHeader::*counter,
                const char* op);
    // per slot: the state word first seen dead while blocking, and when (producer-local)
    std::vector<std::pair<uint64_t, uint64_t>> dead_since_;
};

class Consumer {
public:
    // resume_name: take over the dead slot registered under this name (at its released
    // position) if there is one, else register a new slot under that name.
    Consumer(const std::string& name, uint64_t expected_epoch, const std::string& resume_name = "");
    ~Consumer();
    Consumer(const Consumer&) = delete;
    Consumer& operator=(const Consumer&) = delete;

    PollStatus poll(RecordView* out);
    void release(uint64_t position);
    bool producer_alive() const;
    void close();
    bool closed() const { return !map_; }

    const std::string& name() const { return name_; }
    uint64_t epoch() const { return epoch_; }
    uint64_t capacity() const { return capacity_; }
    uint32_t slot() const { return slot_; }
    uint64_t position() const { return position_; }
    uint64_t released() const { return released_; }
    bool resumed() const { return resumed_; }
    uint64_t head() const;
    const std::shared_ptr<Mapping>& mapping() const { return map_; }

private:
    void require_open(const char* op) const;
    void store_released(uint64_t position);

    std::string name_;
    uint64_t epoch_ = 0;
    uint64_t capacity_ = 0;
    std::shared_ptr<Mapping> map_;
    layout::SegmentHeader* hdr_ = nullptr;
    layout::ConsumerSlot* my_slot_ = nullptr;
    uint8_t* data_ = nullptr;
    uint32_t slot_ = 0;
    uint32_t generation_ = 0;
    uint64_t position_ = 0;
    uint64_t released_ = 0;
    uint64_t last_end_ = 0;  // end of the last record poll() returned
    bool resumed_ = false;
};

// --- segment-level helpers (cold path) ---------------------------------------------------------
struct SlotInfo {
    uint32_t slot, state, generation;
    uint64_t released, pid;
    bool alive;
};
struct SegmentInfo {
    std::string name;
    uint64_t magic, epoch, capacity, head, map_size, data_offset, producer_pid, created_ns;
    uint32_t layout_version, max_consumers;
    bool producer_alive;
    uint64_t committed, reserved, aborted, full_count, reaped, next_seq;
    std::vector<SlotInfo> consumers;
};

bool is_stale(const std::string& name);
void unlink_segment(const std::string& name);
SegmentInfo segment_info(const std::string& name);

}  // namespace hsc
