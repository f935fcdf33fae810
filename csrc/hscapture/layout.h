// hscapture shared-memory ring: THE layout. Every offset of the segment is defined here, once.
// Python reads these values only through `hscapture._ring` module attributes.
//
// Segment (POSIX shm object /dev/shm/<name>, mode 0600, one per producer incarnation):
//
//   0                  HEADER_SIZE (4096)      DATA_OFFSET (page aligned)      MAP_SIZE
//   +------------------+------------------------+------------------------------+
//   | segment header   | consumer slots         | data region                  |
//   |  (1 page)        |  max_consumers x 128 B |  capacity bytes (x64)        |
//   +------------------+------------------------+------------------------------+
//
// Segment header (one page):
//
//   0                   1                   2                   3
//   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//  +---------------------------------------------------------------+  0  descriptor line:
//  |                        magic (u64, atomic)                    |     written once at creation,
//  +-------------------------------+-------------------------------+  8  magic release-stored LAST
//  |       layout_version (u32)    |       max_consumers (u32)     |
//  +-------------------------------+-------------------------------+ 16
//  |                        epoch (u64)                            |
//  +---------------------------------------------------------------+ 24
//  |                        capacity (u64)                         |
//  +---------------------------------------------------------------+ 32
//  |                        data_offset (u64)                      |
//  +---------------------------------------------------------------+ 40
//  |                        map_size (u64)                         |
//  +---------------------------------------------------------------+ 48
//  |                        producer_pid (u64, atomic)             |
//  +---------------------------------------------------------------+ 56
//  |                        created_ns (u64)                       |
//  +---------------------------------------------------------------+ 64
//  |                        control_reserve (u64)                  |
//  +---------------------------------------------------------------+ 72
//  |                        (pad to 128)                           |
//  +---------------------------------------------------------------+ 128 HOT: producer head
//  |                        head (u64, atomic)                     |     alone on 2 cache lines
//  |                        (pad to 256)                           |     (Aeron: adjacent-line
//  +---------------------------------------------------------------+ 256 prefetch = 2 lines)
//  | committed | reserved | aborted | full_count | reaped | next_seq|    producer statistics
//  | control_full | expired | taken                               |    (cold-ish, 2 lines)
//  |           (u64 atomics, relaxed, written by the producer only) |
//  +---------------------------------------------------------------+ 384
//  |                        (pad to HEADER_SIZE)                   |
//  +---------------------------------------------------------------+ 4096
//
// Consumer slot i at SLOTS_OFFSET + i * SLOT_SIZE (SLOT_SIZE = 2 cache lines, so every
// consumer's `released` counter is on its own pair of lines, never next to the head):
//
//  +---------------------------------------------------------------+ 0
//  |  state word (u64 atomic) = generation << 32 | flags | state   |
//  +---------------------------------------------------------------+ 8
//  |  released (u64 atomic): every byte before it may be reused    |
//  +---------------------------------------------------------------+ 16
//  |  pid (u64 atomic, informational: the last owner's pid)        |
//  +---------------------------------------------------------------+ 24
//  |  resume name (64 bytes = 8 u64 atomics, NUL-padded): the name  |
//  |  of a durable subscription; all zero for an anonymous consumer |
//  +---------------------------------------------------------------+ 88
//  |  attached_at (u64 atomic): position the subscription started  |
//  |  reading at (h1 of the registration protocol)                 |
//  +---------------------------------------------------------------+ 96
//  |  delivered (u64 atomic, durable slots): 1 + the highest record |
//  |  sequence number through which the subscriber acknowledged    |
//  |  every sample, in order (0: none); carried across owners of   |
//  |  the name, so a resumer skips what was acknowledged past       |
//  |  `released` (a sample held by an older record kept it back)   |
//  +---------------------------------------------------------------+ 104 .. 128 pad
//
// Slot states: FREE (anyone may register), ACTIVE (bounds the producer at `released`),
// EXPIRED (a durable slot the producer gave up on: keeps name and released, bounds nothing).
// SLOT_DURABLE_FLAG in the state word marks a named (durable) slot; it is set and cleared only
// together with the state, by the same CAS, so the producer never reads the name.
//
// Record (in the data region at offset position % capacity, 64-byte aligned, never wraps):
//
//  +-------------------------------+-------------------------------+ 0
//  |   state (u32 atomic)          |   magic (u32) = RECORD_MAGIC  |
//  +-------------------------------+-------------------------------+ 8
//  |   epoch (u64)                                                 |
//  +---------------------------------------------------------------+ 16
//  |   seq (u64)  per-producer record sequence number              |
//  +---------------------------------------------------------------+ 24
//  |   payload_len (u64)                                           |
//  +---------------------------------------------------------------+ 32
//  |   total_len (u64) = align64(64 + payload_len)                 |
//  +---------------------------------------------------------------+ 40
//  |   position (u64): the record's own 64-bit byte position       |
//  +---------------------------------------------------------------+ 48
//  |   tag (u64)                                                   |
//  +---------------------------------------------------------------+ 56
//  |   reserved (u64)                                              |
//  +---------------------------------------------------------------+ 64
//  |   payload (payload_len bytes), then zero..63 bytes of slack   |
//  +---------------------------------------------------------------+ total_len
//
// A record that would not fit before the end of the data region is preceded by a PADDING
// record (header only, total_len = the rest of the region). Positions are monotonically
// increasing 64-bit byte counters; they never wrap in practice (2^64 bytes).
//
// OFD locks (fcntl F_OFD_SETLK, one byte each, far beyond any real file offset would not
// matter either: locks are advisory and do not need backing bytes):
//   PRODUCER_LOCK_OFFSET      held by the live producer (free => segment is stale)
//   SLOT_LOCK_OFFSET + i      held by the live consumer of slot i
//   REGISTRY_LOCK_OFFSET      held (briefly, blocking F_OFD_SETLKW) by a consumer while it
//                             registers, resumes or looks up names: slot names are written
//                             only under it, so two registrations never race on a name
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hsc::layout {

// --- identity -------------------------------------------------------------------------------
constexpr uint64_t MAGIC = 0x31474e4952435348ull;  // "HSCRING1" read as little-endian bytes
// 2: consumer slots carry a resume name; 3: durable slots (flag, EXPIRED, attached_at),
// control_reserve in the header, control_full/expired counters
constexpr uint32_t LAYOUT_VERSION = 3;
constexpr uint32_t RECORD_MAGIC = 0x44524352u;  // "RCRD" little-endian

// --- sizes ----------------------------------------------------------------------------------
constexpr std::size_t CACHE_LINE = 64;
constexpr std::size_t COUNTER_PAD = 2 * CACHE_LINE;  // hot counters own two lines (Aeron)
constexpr std::size_t PAGE_SIZE = 4096;
constexpr std::size_t RECORD_ALIGN = 64;
constexpr std::size_t RECORD_HEADER_SIZE = 64;
constexpr uint32_t MAX_CONSUMERS = 64;  // hard limit; a segment chooses max_consumers <= this

// --- segment header offsets, derived field by field -------------------------------------------
constexpr std::size_t H_MAGIC = 0;
constexpr std::size_t H_LAYOUT_VERSION = H_MAGIC + sizeof(uint64_t);
constexpr std::size_t H_MAX_CONSUMERS = H_LAYOUT_VERSION + sizeof(uint32_t);
constexpr std::size_t H_EPOCH = H_MAX_CONSUMERS + sizeof(uint32_t);
constexpr std::size_t H_CAPACITY = H_EPOCH + sizeof(uint64_t);
constexpr std::size_t H_DATA_OFFSET = H_CAPACITY + sizeof(uint64_t);
constexpr std::size_t H_MAP_SIZE = H_DATA_OFFSET + sizeof(uint64_t);
constexpr std::size_t H_PRODUCER_PID = H_MAP_SIZE + sizeof(uint64_t);
constexpr std::size_t H_CREATED_NS = H_PRODUCER_PID + sizeof(uint64_t);
constexpr std::size_t H_CONTROL_RESERVE = H_CREATED_NS + sizeof(uint64_t);
constexpr std::size_t H_DESCRIPTOR_END = H_CONTROL_RESERVE + sizeof(uint64_t);
// the hot head starts two lines in, so the descriptor line's readers never share its lines
constexpr std::size_t H_HEAD = COUNTER_PAD;
constexpr std::size_t H_STATS = H_HEAD + COUNTER_PAD;
constexpr std::size_t H_COMMITTED = H_STATS;
constexpr std::size_t H_RESERVED = H_COMMITTED + sizeof(uint64_t);
constexpr std::size_t H_ABORTED = H_RESERVED + sizeof(uint64_t);
constexpr std::size_t H_FULL_COUNT = H_ABORTED + sizeof(uint64_t);
constexpr std::size_t H_REAPED = H_FULL_COUNT + sizeof(uint64_t);
constexpr std::size_t H_NEXT_SEQ = H_REAPED + sizeof(uint64_t);
constexpr std::size_t H_CONTROL_FULL = H_NEXT_SEQ + sizeof(uint64_t);
constexpr std::size_t H_EXPIRED = H_CONTROL_FULL + sizeof(uint64_t);
constexpr std::size_t H_TAKEN = H_EXPIRED + sizeof(uint64_t);
constexpr std::size_t H_STATS_END = H_TAKEN + sizeof(uint64_t);
constexpr std::size_t HEADER_SIZE = PAGE_SIZE;

static_assert(H_DESCRIPTOR_END <= H_HEAD, "descriptor overlaps the head's cache lines");
static_assert(H_STATS_END <= H_STATS + COUNTER_PAD, "stats overflow their two lines");
static_assert(H_STATS + COUNTER_PAD <= HEADER_SIZE, "header overflows its page");

// --- consumer slots ---------------------------------------------------------------------------
constexpr std::size_t SLOTS_OFFSET = HEADER_SIZE;
constexpr std::size_t SLOT_SIZE = COUNTER_PAD;
constexpr std::size_t S_STATE = 0;
constexpr std::size_t S_RELEASED = S_STATE + sizeof(uint64_t);
constexpr std::size_t S_PID = S_RELEASED + sizeof(uint64_t);
constexpr std::size_t S_NAME = S_PID + sizeof(uint64_t);
constexpr std::size_t SLOT_NAME_LEN = 64;
constexpr std::size_t S_ATTACHED_AT = S_NAME + SLOT_NAME_LEN;
constexpr std::size_t S_DELIVERED = S_ATTACHED_AT + sizeof(uint64_t);
constexpr std::size_t S_UNSETTLED = S_DELIVERED + sizeof(uint64_t);
constexpr std::size_t S_READ_THROUGH = S_UNSETTLED + sizeof(uint64_t);
constexpr std::size_t S_END = S_READ_THROUGH + sizeof(uint64_t);
static_assert(SLOT_NAME_LEN % sizeof(uint64_t) == 0, "the name is stored as whole u64 words");
static_assert(S_END <= SLOT_SIZE, "slot overflows its two cache lines");

constexpr uint32_t SLOT_FREE = 0;
constexpr uint32_t SLOT_ACTIVE = 1;
constexpr uint32_t SLOT_EXPIRED = 2;
constexpr uint32_t SLOT_STATE_MASK = 0xffffu;
constexpr uint32_t SLOT_DURABLE_FLAG = 1u << 16;  // a named subscription (never reaped)
constexpr uint64_t slot_word(uint32_t generation, uint32_t state, bool durable = false) {
    return (uint64_t(generation) << 32) | state | (durable ? SLOT_DURABLE_FLAG : 0u);
}
constexpr uint32_t slot_state(uint64_t word) { return uint32_t(word) & SLOT_STATE_MASK; }
constexpr bool slot_durable(uint64_t word) { return (uint32_t(word) & SLOT_DURABLE_FLAG) != 0; }
constexpr uint32_t slot_generation(uint64_t word) { return uint32_t(word >> 32); }

// --- record header ----------------------------------------------------------------------------
constexpr std::size_t R_STATE = 0;
constexpr std::size_t R_MAGIC = R_STATE + sizeof(uint32_t);
constexpr std::size_t R_EPOCH = R_MAGIC + sizeof(uint32_t);
constexpr std::size_t R_SEQ = R_EPOCH + sizeof(uint64_t);
constexpr std::size_t R_PAYLOAD_LEN = R_SEQ + sizeof(uint64_t);
constexpr std::size_t R_TOTAL_LEN = R_PAYLOAD_LEN + sizeof(uint64_t);
constexpr std::size_t R_POSITION = R_TOTAL_LEN + sizeof(uint64_t);
constexpr std::size_t R_TAG = R_POSITION + sizeof(uint64_t);
constexpr std::size_t R_RESERVED = R_TAG + sizeof(uint64_t);
constexpr std::size_t R_END = R_RESERVED + sizeof(uint64_t);
static_assert(R_END == RECORD_HEADER_SIZE, "record header must be exactly 64 bytes");

// record states (u32). 0 never appears in a written header.
constexpr uint32_t STATE_RESERVED = 1;   // space claimed, payload being written
constexpr uint32_t STATE_COMMITTED = 2;  // payload complete; readers may read it
constexpr uint32_t STATE_ABORTED = 3;    // skipped by readers
constexpr uint32_t STATE_PADDING = 4;    // filler up to the end of the data region

// --- OFD lock bytes ---------------------------------------------------------------------------
constexpr uint64_t PRODUCER_LOCK_OFFSET = 0;
constexpr uint64_t SLOT_LOCK_OFFSET = 1;  // slot i locks byte SLOT_LOCK_OFFSET + i
constexpr uint64_t REGISTRY_LOCK_OFFSET = SLOT_LOCK_OFFSET + MAX_CONSUMERS;

// --- derived sizes ----------------------------------------------------------------------------
constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr uint64_t record_total_len(uint64_t payload_len) {
    return align_up(RECORD_HEADER_SIZE + payload_len, RECORD_ALIGN);
}
constexpr uint64_t data_offset(uint32_t max_consumers) {
    return align_up(SLOTS_OFFSET + uint64_t(max_consumers) * SLOT_SIZE, PAGE_SIZE);
}
constexpr uint64_t map_size(uint32_t max_consumers, uint64_t capacity) {
    return align_up(data_offset(max_consumers) + capacity, PAGE_SIZE);
}

// --- the same layout as C++ types (static_assert ties each field to its offset) ---------------
static_assert(std::atomic<uint64_t>::is_always_lock_free, "need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "need lock-free 32-bit atomics");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4,
              "atomics must have the size of the plain integer (shared with other processes)");

struct SegmentHeader {
    std::atomic<uint64_t> magic;
    uint32_t layout_version;
    uint32_t max_consumers;
    uint64_t epoch;
    uint64_t capacity;
    uint64_t data_offset;
    uint64_t map_size;
    std::atomic<uint64_t> producer_pid;
    uint64_t created_ns;
    uint64_t control_reserve;
    uint8_t pad0[H_HEAD - H_DESCRIPTOR_END];
    alignas(CACHE_LINE) std::atomic<uint64_t> head;
    uint8_t pad1[H_STATS - H_HEAD - sizeof(uint64_t)];
    alignas(CACHE_LINE) std::atomic<uint64_t> committed;
    std::atomic<uint64_t> reserved;
    std::atomic<uint64_t> aborted;
    std::atomic<uint64_t> full_count;
    std::atomic<uint64_t> reaped;
    std::atomic<uint64_t> next_seq;
    std::atomic<uint64_t> control_full;
    std::atomic<uint64_t> expired;
    // The producer's sample numbering (not the record seq above): every sample number below
    // it was taken by a capture, drop or abort, whether it reached the ring or not (its
    // backlog, a copy never committed). Written only by the producer (release store,
    // monotonic) as it takes numbers; read (acquire) by a subscriber retiring the incarnation
    // once its producer is gone: numbers below it that it never read are reported lost, so a
    // SIGKILL cannot hide drops that never left the producer's memory. 0 in a segment of an
    // older build (the field was padding, zero-filled).
    std::atomic<uint64_t> taken;
    uint8_t pad2[HEADER_SIZE - H_STATS_END];
};

struct ConsumerSlot {
    std::atomic<uint64_t> state;
    std::atomic<uint64_t> released;
    std::atomic<uint64_t> pid;
    // Written (relaxed) only by a registrant that holds the registry lock and the slot's lock,
    // while the slot is FREE, before the ACTIVE CAS that publishes it; read under the registry
    // lock, or (segment_info) validated by re-loading `state` afterwards. Atomic words so that
    // a reader racing a writer reads stale words, never undefined behaviour.
    std::atomic<uint64_t> name[SLOT_NAME_LEN / sizeof(uint64_t)];
    std::atomic<uint64_t> attached_at;
    // Written only by the slot's owner (release store, monotonic); zeroed by a registrant of a
    // FREE slot before the ACTIVE CAS that publishes it; loaded by a resumer after its CAS.
    std::atomic<uint64_t> delivered;
    // Written only by the slot's owner (release store, not monotonic); zeroed like
    // `delivered`; loaded by a resumer after its CAS, before `delivered`.
    std::atomic<uint64_t> unsettled;
    // Written only by the slot's owner (release store, monotonic) before each `released`
    // store; zeroed like `delivered`; loaded by a resumer after its CAS. 0 in a segment of an
    // older build (the field was padding, zero-filled): the resumer then has no bound.
    std::atomic<uint64_t> read_through;
    uint8_t pad[SLOT_SIZE - S_END];
};

struct RecordHeader {
    std::atomic<uint32_t> state;
    uint32_t magic;
    uint64_t epoch;
    uint64_t seq;
    uint64_t payload_len;
    uint64_t total_len;
    uint64_t position;
    uint64_t tag;
    uint64_t reserved;
};

static_assert(offsetof(SegmentHeader, magic) == H_MAGIC);
static_assert(offsetof(SegmentHeader, layout_version) == H_LAYOUT_VERSION);
static_assert(offsetof(SegmentHeader, max_consumers) == H_MAX_CONSUMERS);
static_assert(offsetof(SegmentHeader, epoch) == H_EPOCH);
static_assert(offsetof(SegmentHeader, capacity) == H_CAPACITY);
static_assert(offsetof(SegmentHeader, data_offset) == H_DATA_OFFSET);
static_assert(offsetof(SegmentHeader, map_size) == H_MAP_SIZE);
static_assert(offsetof(SegmentHeader, producer_pid) == H_PRODUCER_PID);
static_assert(offsetof(SegmentHeader, created_ns) == H_CREATED_NS);
static_assert(offsetof(SegmentHeader, control_reserve) == H_CONTROL_RESERVE);
static_assert(offsetof(SegmentHeader, head) == H_HEAD);
static_assert(offsetof(SegmentHeader, committed) == H_COMMITTED);
static_assert(offsetof(SegmentHeader, reserved) == H_RESERVED);
static_assert(offsetof(SegmentHeader, aborted) == H_ABORTED);
static_assert(offsetof(SegmentHeader, full_count) == H_FULL_COUNT);
static_assert(offsetof(SegmentHeader, reaped) == H_REAPED);
static_assert(offsetof(SegmentHeader, next_seq) == H_NEXT_SEQ);
static_assert(offsetof(SegmentHeader, control_full) == H_CONTROL_FULL);
static_assert(offsetof(SegmentHeader, expired) == H_EXPIRED);
static_assert(offsetof(SegmentHeader, taken) == H_TAKEN);
static_assert(sizeof(SegmentHeader) == HEADER_SIZE);

static_assert(offsetof(ConsumerSlot, state) == S_STATE);
static_assert(offsetof(ConsumerSlot, released) == S_RELEASED);
static_assert(offsetof(ConsumerSlot, pid) == S_PID);
static_assert(offsetof(ConsumerSlot, name) == S_NAME);
static_assert(offsetof(ConsumerSlot, attached_at) == S_ATTACHED_AT);
static_assert(offsetof(ConsumerSlot, delivered) == S_DELIVERED);
static_assert(offsetof(ConsumerSlot, unsettled) == S_UNSETTLED);
static_assert(offsetof(ConsumerSlot, read_through) == S_READ_THROUGH);
static_assert(sizeof(ConsumerSlot) == SLOT_SIZE);

static_assert(offsetof(RecordHeader, state) == R_STATE);
static_assert(offsetof(RecordHeader, magic) == R_MAGIC);
static_assert(offsetof(RecordHeader, epoch) == R_EPOCH);
static_assert(offsetof(RecordHeader, seq) == R_SEQ);
static_assert(offsetof(RecordHeader, payload_len) == R_PAYLOAD_LEN);
static_assert(offsetof(RecordHeader, total_len) == R_TOTAL_LEN);
static_assert(offsetof(RecordHeader, position) == R_POSITION);
static_assert(offsetof(RecordHeader, tag) == R_TAG);
static_assert(offsetof(RecordHeader, reserved) == R_RESERVED);
static_assert(sizeof(RecordHeader) == RECORD_HEADER_SIZE);

}  // namespace hsc::layout
