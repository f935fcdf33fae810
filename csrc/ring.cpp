// hscapture shared-memory ring: producer and consumer cores.
//
// Memory-ordering contract (every atomic pair is marked "SYNC POINT" on both sides):
//
//   (1) record publication, producer -> consumer (Aeron: claim / commit by release store):
//       producer writes the RESERVED header, then release-stores `head` past it  ---> consumer
//       acquire-loads `head` and only then reads the header at a position < head.
//       producer writes the payload, then release-stores `state = COMMITTED`     ---> consumer
//       acquire-loads `state` and only reads the payload after seeing COMMITTED.
//   (2) space reclamation, consumer -> producer (Linux perf ring's tail):
//       consumer finishes reading bytes < P, then release-stores `released = P`  ---> producer
//       acquire-loads `released` (inside a seq_cst scan) before overwriting those bytes.
//   (3) consumer registration (seq_cst, see Consumer::Consumer for the argument):
//       producer: store head (seq_cst) ... then scan slot states (seq_cst);
//       consumer: store slot ACTIVE (seq_cst) ... then load head (seq_cst).
//   (4) segment initialisation: the creator fills the header, then release-stores `magic`;
//       an attacher acquire-loads `magic` and only then trusts the other header fields.
//
// Liveness is not in shared memory at all: each party holds an OFD lock (fcntl F_OFD_SETLK)
// on one byte of the segment file; the kernel drops it when the process dies, and anyone can
// ask with F_OFD_GETLK. So a crashed consumer frees its slot without any timeout.

#include "hscapture/ring.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hsc {

using namespace hsc::layout;

namespace {

[[noreturn]] void fail(ErrorKind kind, const std::string& msg) { throw RingException(kind, msg); }

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

std::string hex(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string shm_path(const std::string& name) {
    std::string n = name;
    if (!n.empty() && n[0] == '/') n.erase(0, 1);
    if (n.empty() || n.size() > 200 || n.find('/') != std::string::npos || n == "." || n == "..")
        fail(ErrorKind::Value, "invalid segment name '" + name +
                                   "': expected 1..200 characters without '/'");
    return "/" + n;
}

uint64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

uint64_t random_epoch() {
    uint64_t e = 0;
    while (e == 0) {
        ssize_t n = getrandom(&e, sizeof e, 0);
        if (n != ssize_t(sizeof e)) {
            if (n < 0 && errno == EINTR) continue;
            fail(ErrorKind::Ring, "getrandom failed: " + errno_text(errno));
        }
    }
    return e;
}

// A one-byte OFD lock request at `offset` (l_pid must be 0 for OFD locks).
struct flock one_byte(short type, uint64_t offset) {
    struct flock fl{};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = off_t(offset);
    fl.l_len = 1;
    fl.l_pid = 0;
    return fl;
}

// Non-blocking OFD write lock on one byte. true = we hold it, false = someone else does.
bool ofd_trylock(int fd, uint64_t offset) {
    struct flock fl = one_byte(F_WRLCK, offset);
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EAGAIN || errno == EACCES) return false;
    fail(ErrorKind::Ring, "fcntl(F_OFD_SETLK) failed: " + errno_text(errno));
}

void ofd_unlock(int fd, uint64_t offset) {
    struct flock fl = one_byte(F_UNLCK, offset);
    (void)fcntl(fd, F_OFD_SETLK, &fl);
}

// true if an open file description other than `fd`'s holds a lock on the byte.
bool ofd_locked_by_other(int fd, uint64_t offset) {
    struct flock fl = one_byte(F_WRLCK, offset);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        fail(ErrorKind::Ring, "fcntl(F_OFD_GETLK) failed: " + errno_text(errno));
    return fl.l_type != F_UNLCK;
}

// Opens an existing segment, checks ownership and mode, maps it, checks magic/version/epoch.
std::shared_ptr<Mapping> attach_segment(const std::string& name, uint64_t expected_epoch) {
    std::string path = shm_path(name);
    int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) fail(ErrorKind::SegmentNotFound, "segment '" + name + "' does not exist (/dev/shm" + path + ")");
        if (err == EACCES) fail(ErrorKind::SegmentPermission, "segment '" + name + "': permission denied opening it");
        fail(ErrorKind::Ring, "shm_open('" + name + "') failed: " + errno_text(err));
    }
    auto m = std::make_shared<Mapping>();
    m->fd = fd;
    struct stat st{};
    if (fstat(fd, &st) != 0) fail(ErrorKind::Ring, "fstat failed: " + errno_text(errno));
    if (st.st_uid != geteuid())
        fail(ErrorKind::SegmentPermission, "segment '" + name + "' is owned by uid " + std::to_string(st.st_uid) +
                                               ": expected uid " + std::to_string(geteuid()) + " (the current user)");
    unsigned mode = unsigned(st.st_mode & 07777);
    if (mode != 0600) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "has mode 0%o: expected mode 0600", mode);
        fail(ErrorKind::SegmentPermission, "segment '" + name + "' " + buf);
    }
    if (uint64_t(st.st_size) < HEADER_SIZE + PAGE_SIZE)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "' is " + std::to_string(st.st_size) +
                                            " bytes: expected at least " + std::to_string(HEADER_SIZE + PAGE_SIZE) +
                                            " (not an hscapture ring, or not initialised yet)");
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) fail(ErrorKind::Ring, "mmap of segment '" + name + "' failed: " + errno_text(errno));
    m->base = static_cast<uint8_t*>(p);
    m->size = size_t(st.st_size);
    auto* hdr = reinterpret_cast<SegmentHeader*>(m->base);
    // SYNC POINT (4) acquire: pairs with the creator's release store of `magic`; every other
    // header field read below was written before it.
    uint64_t magic = hdr->magic.load(std::memory_order_acquire);
    if (magic != MAGIC)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "': expected magic " + hex(MAGIC) + ", found " +
                                            hex(magic) + (magic == 0 ? " (not initialised yet?)" : ""));
    if (hdr->layout_version != LAYOUT_VERSION)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "': expected layout version " +
                                            std::to_string(LAYOUT_VERSION) + ", found " +
                                            std::to_string(hdr->layout_version));
    if (expected_epoch != 0 && hdr->epoch != expected_epoch)
        fail(ErrorKind::EpochMismatch, "segment '" + name + "': expected epoch " + hex(expected_epoch) +
                                           ", found " + hex(hdr->epoch));
    if (hdr->map_size != m->size || hdr->max_consumers == 0 || hdr->max_consumers > MAX_CONSUMERS ||
        hdr->data_offset != data_offset(hdr->max_consumers) || hdr->capacity % RECORD_ALIGN != 0 ||
        hdr->data_offset + hdr->capacity > hdr->map_size)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "': inconsistent header (map_size " +
                                            std::to_string(hdr->map_size) + ", file size " + std::to_string(m->size) +
                                            ", capacity " + std::to_string(hdr->capacity) + ")");
    return m;
}

}  // namespace

const char* error_class_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::Ring: return "RingError";
        case ErrorKind::SegmentExists: return "SegmentExistsError";
        case ErrorKind::SegmentNotFound: return "SegmentNotFoundError";
        case ErrorKind::SegmentPermission: return "SegmentPermissionError";
        case ErrorKind::LayoutMismatch: return "LayoutMismatchError";
        case ErrorKind::EpochMismatch: return "EpochMismatchError";
        case ErrorKind::OutOfSpace: return "OutOfSpaceError";
        case ErrorKind::RecordTooLarge: return "RecordTooLargeError";
        case ErrorKind::RingFull: return "RingFullError";
        case ErrorKind::ConsumerSlotsExhausted: return "ConsumerSlotsExhaustedError";
        case ErrorKind::Value: return "ValueError";
    }
    return "RingError";
}

Mapping::~Mapping() {
    if (base) munmap(base, size);
    if (fd >= 0) ::close(fd);
}

// ================================================================================================
// Producer
// ================================================================================================

Producer::Producer(const std::string& name, uint64_t capacity, uint32_t max_consumers, uint64_t epoch)
    : name_(name), capacity_(capacity), max_consumers_(max_consumers) {
    std::string path = shm_path(name);
    if (capacity < 2 * RECORD_ALIGN || capacity % RECORD_ALIGN != 0 || capacity > (uint64_t(1) << 50))
        fail(ErrorKind::Value, "capacity " + std::to_string(capacity) + ": expected a multiple of " +
                                   std::to_string(RECORD_ALIGN) + " between " + std::to_string(2 * RECORD_ALIGN) +
                                   " and 2**50");
    if (max_consumers == 0 || max_consumers > MAX_CONSUMERS)
        fail(ErrorKind::Value, "max_consumers " + std::to_string(max_consumers) + ": expected 1.." +
                                   std::to_string(MAX_CONSUMERS));
    epoch_ = epoch != 0 ? epoch : random_epoch();
    const uint64_t msize = map_size(max_consumers, capacity);

    int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int err = errno;
        if (err == EEXIST) fail(ErrorKind::SegmentExists, "segment '" + name + "' already exists (segments are created O_EXCL)");
        if (err == EACCES) fail(ErrorKind::SegmentPermission, "segment '" + name + "': permission denied creating it");
        fail(ErrorKind::Ring, "shm_open('" + name + "', O_CREAT|O_EXCL) failed: " + errno_text(err));
    }
    auto m = std::make_shared<Mapping>();
    m->fd = fd;
    auto undo = [&](ErrorKind kind, const std::string& msg) {
        shm_unlink(path.c_str());
        fail(kind, msg);
    };
    // Take the producer lock first, so the segment never looks stale while being set up.
    if (!ofd_trylock(fd, PRODUCER_LOCK_OFFSET)) undo(ErrorKind::Ring, "could not take the producer lock of a fresh segment");
    // The umask may have cleared bits of 0600 (never added any); make the mode exactly 0600.
    if (fchmod(fd, 0600) != 0) undo(ErrorKind::Ring, "fchmod(0600) failed: " + errno_text(errno));
    if (ftruncate(fd, off_t(msize)) != 0) {
        int err = errno;
        undo(err == ENOSPC || err == EFBIG ? ErrorKind::OutOfSpace : ErrorKind::Ring,
             "ftruncate(" + std::to_string(msize) + ") of segment '" + name + "' failed: " + errno_text(err));
    }
    // Reserve every page now: on tmpfs a sparse file would SIGBUS on first touch of a page that
    // /dev/shm cannot supply; posix_fallocate turns that into ENOSPC here, at creation.
    int rc = posix_fallocate(fd, 0, off_t(msize));
    if (rc != 0)
        undo(rc == ENOSPC ? ErrorKind::OutOfSpace : ErrorKind::Ring,
             "reserving " + std::to_string(msize) + " bytes for segment '" + name + "' in /dev/shm failed: " +
                 errno_text(rc) + (rc == ENOSPC ? ": expected that much free space in /dev/shm" : ""));
    void* p = mmap(nullptr, size_t(msize), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) undo(ErrorKind::Ring, "mmap failed: " + errno_text(errno));
    m->base = static_cast<uint8_t*>(p);
    m->size = size_t(msize);

    hdr_ = reinterpret_cast<SegmentHeader*>(m->base);
    slots_ = reinterpret_cast<ConsumerSlot*>(m->base + SLOTS_OFFSET);
    data_ = m->base + data_offset(max_consumers);
    // The file is fresh (O_EXCL + fallocate): all bytes are zero, so all slots are FREE, gen 0.
    hdr_->layout_version = LAYOUT_VERSION;
    hdr_->max_consumers = max_consumers;
    hdr_->epoch = epoch_;
    hdr_->capacity = capacity;
    hdr_->data_offset = data_offset(max_consumers);
    hdr_->map_size = msize;
    hdr_->producer_pid.store(uint64_t(getpid()), std::memory_order_relaxed);
    hdr_->created_ns = now_ns();
    hdr_->head.store(0, std::memory_order_relaxed);
    // SYNC POINT (4) release: publishes every header field above to attachers, which
    // acquire-load `magic` before reading anything else.
    hdr_->magic.store(MAGIC, std::memory_order_release);
    map_ = std::move(m);
}

Producer::~Producer() { close(true); }

void Producer::require_open(const char* op) const {
    if (!map_) fail(ErrorKind::Ring, std::string("Producer.") + op + ": the producer of '" + name_ + "' is closed");
}

void Producer::close(bool unlink) {
    std::lock_guard<std::mutex> guard(mu_);
    if (!map_) return;
    ofd_unlock(map_->fd, PRODUCER_LOCK_OFFSET);
    if (unlink) shm_unlink(shm_path(name_).c_str());
    map_.reset();  // unmapped once the last payload view dies
    hdr_ = nullptr;
    slots_ = nullptr;
    data_ = nullptr;
}

// Returns the new reuse limit: min `released` over live consumers (head_ if there are none).
// Slots whose consumer died (OFD lock free) are freed: all of them if reap_all, else only
// those that block a reservation ending at `end`.
// A dead slot may be freed once it has been seen dead (with the same state word) for the grace
// period; until then it still bounds the producer (which then reports "full").
bool Producer::grace_expired(uint32_t i, uint64_t word) {
    if (dead_grace_ns_ == 0) return true;
    if (dead_since_.size() < max_consumers_) dead_since_.assign(max_consumers_, {0, 0});
    auto& seen = dead_since_[i];
    const uint64_t now = now_ns();
    if (seen.first != word || seen.second == 0) {
        seen = {word, now};
        return false;
    }
    return now - seen.second >= dead_grace_ns_;
}

uint64_t Producer::scan_consumers(uint64_t end, bool reap_all, int* reaped, uint32_t* live) {
    uint64_t limit = head_;
    uint32_t n_live = 0;
    for (uint32_t i = 0; i < max_consumers_; ++i) {
        ConsumerSlot& s = slots_[i];
        // SYNC POINT (3) seq_cst: this load is ordered after our seq_cst store of `head` in the
        // previous reserve; a consumer whose ACTIVE store we miss here will read a head at least
        // that large (see Consumer::Consumer).
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) != SLOT_ACTIVE) continue;
        // SYNC POINT (2) acquire (seq_cst): pairs with the consumer's release store of
        // `released`; its reads of bytes below this value are complete before we reuse them.
        uint64_t rel = s.released.load(std::memory_order_seq_cst);
        bool blocks = rel + capacity_ < end;
        if ((reap_all || blocks) && !ofd_locked_by_other(map_->fd, SLOT_LOCK_OFFSET + i) &&
            grace_expired(i, word)) {
            // The consumer is dead (the kernel dropped its lock). Free the slot, but only if it
            // still holds the generation we looked at: a new consumer that re-claimed the slot
            // meanwhile bumped the generation, and this CAS then fails instead of clobbering it.
            uint64_t freed = slot_word(slot_generation(word) + 1, SLOT_FREE);
            if (s.state.compare_exchange_strong(word, freed, std::memory_order_seq_cst)) {
                hdr_->reaped.fetch_add(1, std::memory_order_relaxed);
                if (reaped) ++*reaped;
                continue;
            }
            if (slot_state(word) != SLOT_ACTIVE) continue;
            rel = s.released.load(std::memory_order_seq_cst);  // re-claimed: count the new one
        }
        ++n_live;
        if (rel < limit) limit = rel;
    }
    if (live) *live = n_live;
    return limit;
}

void Producer::write_padding(uint64_t p, uint64_t off, uint64_t pad) {
    auto* ph = reinterpret_cast<RecordHeader*>(data_ + off);
    ph->magic = RECORD_MAGIC;
    ph->epoch = epoch_;
    ph->seq = seq_;  // padding does not consume a sequence number
    ph->payload_len = 0;
    ph->total_len = pad;
    ph->position = p;
    ph->tag = 0;
    ph->reserved = 0;
    // published by the caller's release store of head
    ph->state.store(STATE_PADDING, std::memory_order_relaxed);
}

int64_t Producer::reserve(uint64_t payload_len, uint64_t tag) {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("reserve");
    if (payload_len > capacity_ || record_total_len(payload_len) > capacity_) return RESERVE_TOO_LARGE;
    const uint64_t total = record_total_len(payload_len);
    const uint64_t p = head_;
    const uint64_t off = p % capacity_;
    const uint64_t pad = off + total > capacity_ ? capacity_ - off : 0;
    const uint64_t end = p + pad + total;
    // Bytes [end - capacity, end) of the previous lap get overwritten: all live consumers must
    // have released up to end - capacity, and no record of ours may still be uncommitted there
    // (its copy may be in flight). Re-scan consumers only when the cached limit says "full".
    const uint64_t floor = inflight_.empty() ? UINT64_MAX : inflight_.front().first;
    if (end > std::min(limit_, floor) + capacity_) {
        limit_ = scan_consumers(end, false, nullptr, nullptr);
        const uint64_t lim = std::min(limit_, floor);
        if (end > lim + capacity_) {
            hdr_->full_count.fetch_add(1, std::memory_order_relaxed);
            // The record does not fit, but if the padding alone does, publish it now: the head
            // moves to offset 0, so once consumers release the padding the record can fit. If
            // we waited, a record larger than the free space left of the wrap point could never
            // be placed even in an empty ring (nobody would ever release more).
            if (pad != 0 && p + pad <= lim + capacity_) {
                write_padding(p, off, pad);
                head_ = p + pad;
                // SYNC POINT (1) release: publishes the PADDING header (see below).
                hdr_->head.store(head_, std::memory_order_seq_cst);
            }
            return RESERVE_FULL;
        }
    }
    if (pad != 0) write_padding(p, off, pad);
    const uint64_t pos = p + pad;
    auto* h = reinterpret_cast<RecordHeader*>(data_ + pos % capacity_);
    h->magic = RECORD_MAGIC;
    h->epoch = epoch_;
    h->seq = seq_;
    h->payload_len = payload_len;
    h->total_len = total;
    h->position = pos;
    h->tag = tag;
    h->reserved = 0;
    // published by the release store of head below; COMMITTED comes later by its own release
    h->state.store(STATE_RESERVED, std::memory_order_relaxed);
    ++seq_;
    hdr_->next_seq.store(seq_, std::memory_order_relaxed);
    head_ = end;
    // SYNC POINT (1) release: publishes the RESERVED (and PADDING) headers written above to
    // consumers, which acquire-load `head` before reading any header below it.
    // SYNC POINT (3) seq_cst: ordered before the slot scan of our next reserve (registration).
    hdr_->head.store(end, std::memory_order_seq_cst);
    hdr_->reserved.fetch_add(1, std::memory_order_relaxed);
    inflight_.emplace_back(pos, false);
    return int64_t(pos);
}

// Marks a reserved record settled (committed or aborted); forgets settled records at the front.
void Producer::settle_locked(uint64_t position) {
    for (auto& e : inflight_)
        if (e.first == position) {
            e.second = true;
            break;
        }
    while (!inflight_.empty() && inflight_.front().second) inflight_.pop_front();
}

RecordHeader* Producer::checked_record(uint64_t position, const char* op) {
    require_open(op);
    if (position % RECORD_ALIGN != 0 || position >= head_ || position + capacity_ < head_)
        fail(ErrorKind::Value, std::string("Producer.") + op + "(" + std::to_string(position) +
                                   "): expected the position of a record reserved in the current lap (head " +
                                   std::to_string(head_) + ")");
    auto* h = reinterpret_cast<RecordHeader*>(data_ + position % capacity_);
    uint32_t st = h->state.load(std::memory_order_relaxed);  // only we write it
    if (h->magic != RECORD_MAGIC || h->position != position || st == STATE_PADDING)
        fail(ErrorKind::Value, std::string("Producer.") + op + "(" + std::to_string(position) +
                                   "): no record starts there (found position " + std::to_string(h->position) + ")");
    return h;
}

// Moves a RESERVED record to its final state (COMMITTED or ABORTED) and forgets it as in flight.
void Producer::finish(uint64_t position, uint32_t state, std::atomic<uint64_t> SegmentHeader::*counter,
                      const char* op) {
    std::lock_guard<std::mutex> guard(mu_);
    RecordHeader* h = checked_record(position, op);
    uint32_t st = h->state.load(std::memory_order_relaxed);
    if (st != STATE_RESERVED)
        fail(ErrorKind::Value, std::string("Producer.") + op + "(" + std::to_string(position) +
                                   "): expected state RESERVED (" + std::to_string(STATE_RESERVED) +
                                   "), found " + std::to_string(st));
    // SYNC POINT (1) release: COMMITTED publishes the payload bytes to consumers, which
    // acquire-load `state` and read the payload only after seeing it; readers that acquire
    // ABORTED skip the record without reading its payload.
    h->state.store(state, std::memory_order_release);
    (hdr_->*counter).fetch_add(1, std::memory_order_relaxed);
    settle_locked(position);
}

void Producer::commit(uint64_t position) { finish(position, STATE_COMMITTED, &SegmentHeader::committed, "commit"); }

void Producer::abort(uint64_t position) { finish(position, STATE_ABORTED, &SegmentHeader::aborted, "abort"); }

uint8_t* Producer::payload(uint64_t position, uint64_t* payload_len) {
    std::lock_guard<std::mutex> guard(mu_);
    RecordHeader* h = checked_record(position, "payload");
    *payload_len = h->payload_len;
    return reinterpret_cast<uint8_t*>(h) + RECORD_HEADER_SIZE;
}

uint64_t Producer::record_seq(uint64_t position) {
    std::lock_guard<std::mutex> guard(mu_);
    return checked_record(position, "record_seq")->seq;
}

int Producer::reap() {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("reap");
    int n = 0;
    uint32_t live = 0;
    limit_ = scan_consumers(head_ + capacity_, true, &n, &live);
    return n;
}

ProducerStats Producer::stats() {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("stats");
    uint32_t live = 0;
    // a scan without reaping: only the slots that block a (hypothetical) full lap are checked
    uint64_t min_rel = scan_consumers(0, false, nullptr, &live);
    return ProducerStats{hdr_->committed.load(std::memory_order_relaxed),
                         hdr_->reserved.load(std::memory_order_relaxed),
                         hdr_->aborted.load(std::memory_order_relaxed),
                         hdr_->full_count.load(std::memory_order_relaxed),
                         hdr_->reaped.load(std::memory_order_relaxed),
                         min_rel,
                         live,
                         head_,
                         seq_};
}

// ================================================================================================
// Consumer
// ================================================================================================

Consumer::Consumer(const std::string& name, uint64_t expected_epoch, const std::string& resume_name)
    : name_(name) {
    if (resume_name.size() >= SLOT_NAME_LEN)
        fail(ErrorKind::Value, "resume name '" + resume_name + "': expected at most " +
                                   std::to_string(SLOT_NAME_LEN - 1) + " bytes");
    auto m = attach_segment(name, expected_epoch);
    hdr_ = reinterpret_cast<SegmentHeader*>(m->base);
    epoch_ = hdr_->epoch;
    capacity_ = hdr_->capacity;
    data_ = m->base + hdr_->data_offset;
    auto* slots = reinterpret_cast<ConsumerSlot*>(m->base + SLOTS_OFFSET);
    const uint32_t n = hdr_->max_consumers;
    // Resume: a dead consumer's ACTIVE slot under our name still bounds the producer at its
    // `released` position, so every record from there on is intact: take it over in place.
    for (uint32_t i = 0; !resume_name.empty() && i < n; ++i) {
        ConsumerSlot& s = slots[i];
        // SYNC POINT (5) seq_cst: pairs with the dead owner's ACTIVE CAS, which published `name`.
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) != SLOT_ACTIVE || strncmp(s.name, resume_name.c_str(), SLOT_NAME_LEN) != 0)
            continue;
        if (!ofd_trylock(m->fd, SLOT_LOCK_OFFSET + i)) continue;  // its owner is alive
        // SYNC POINT (5) seq_cst: the generation bump makes a concurrent reaper's CAS (which
        // expects `word`) fail; if the reaper won instead, our CAS fails and we register anew.
        uint64_t mine = slot_word(slot_generation(word) + 1, SLOT_ACTIVE);
        if (!s.state.compare_exchange_strong(word, mine, std::memory_order_seq_cst)) {
            ofd_unlock(m->fd, SLOT_LOCK_OFFSET + i);
            continue;
        }
        s.pid.store(uint64_t(getpid()), std::memory_order_relaxed);
        my_slot_ = &s;
        slot_ = i;
        generation_ = slot_generation(mine);
        position_ = released_ = last_end_ = s.released.load(std::memory_order_seq_cst);
        resumed_ = true;
        map_ = std::move(m);
        return;
    }
    for (uint32_t i = 0; i < n; ++i) {
        // Our own open file description (fresh shm_open above): the lock identifies us.
        if (!ofd_trylock(m->fd, SLOT_LOCK_OFFSET + i)) continue;  // a live consumer holds it
        ConsumerSlot& s = slots[i];
        // Registration race, and why it is safe.
        //
        // 1. h0 = head (seq_cst); released = h0.
        // 2. state = ACTIVE with a new generation (seq_cst CAS).
        // 3. h1 = head (seq_cst); released = h1; we start reading at h1.
        //
        // The producer, in reserve(), stores head (seq_cst) and, in a later reserve that would
        // be full, scans the slot states (seq_cst). Suppose a scan missed our ACTIVE store. Then
        // in the single total order S of seq_cst operations that scan's load precedes our store
        // (2), which precedes our load (3); the producer's head store that preceded the scan in
        // program order precedes the scan in S. So our load (3) returns at least the head H the
        // producer had when it scanned. The limit L computed by that scan is a min of released
        // values (or the head itself with no consumers), all <= H <= h1. Reservations made with
        // limit L only overwrite bytes at positions < L <= h1, and we never read below h1.
        // A scan that did see ACTIVE also sees released >= h0 (stored before (2)), so it never
        // lets the producer overwrite anything at or above h0 <= h1 without our release.
        // The generation bump in (2) makes a concurrent reaper's CAS (which expects the old
        // dead consumer's word) fail instead of freeing the slot under us.
        uint64_t h0 = hdr_->head.load(std::memory_order_seq_cst);
        s.released.store(h0, std::memory_order_seq_cst);
        s.pid.store(uint64_t(getpid()), std::memory_order_relaxed);
        // published by the ACTIVE CAS below (seq_cst), read only after this slot's lock is free
        memset(s.name, 0, SLOT_NAME_LEN);
        memcpy(s.name, resume_name.data(), resume_name.size());
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        uint64_t mine;
        do {
            mine = slot_word(slot_generation(word) + 1, SLOT_ACTIVE);
            // SYNC POINT (3) seq_cst: our ACTIVE store, ordered before the head load below.
        } while (!s.state.compare_exchange_weak(word, mine, std::memory_order_seq_cst));
        // SYNC POINT (3) seq_cst: sees at least the head the producer stored before any scan
        // that missed our ACTIVE store.
        uint64_t h1 = hdr_->head.load(std::memory_order_seq_cst);
        s.released.store(h1, std::memory_order_seq_cst);
        my_slot_ = &s;
        slot_ = i;
        generation_ = slot_generation(mine);
        position_ = released_ = last_end_ = h1;
        map_ = std::move(m);
        return;
    }
    fail(ErrorKind::ConsumerSlotsExhausted, "segment '" + name + "': all " + std::to_string(n) +
                                                " consumer slots are held by live consumers: expected a free slot");
}

Consumer::~Consumer() { close(); }

void Consumer::require_open(const char* op) const {
    if (!map_) fail(ErrorKind::Ring, std::string("Consumer.") + op + ": the consumer of '" + name_ + "' is closed");
}

void Consumer::close() {
    if (!map_) return;
    uint64_t word = slot_word(generation_, SLOT_ACTIVE);
    // Free our slot unless it was reaped meanwhile (only possible if our lock was lost).
    my_slot_->state.compare_exchange_strong(word, slot_word(generation_ + 1, SLOT_FREE), std::memory_order_seq_cst);
    // The mapping keeps the open file description alive while payload views exist, and an OFD
    // lock lives as long as its description: unlock explicitly so the slot is free right now.
    ofd_unlock(map_->fd, SLOT_LOCK_OFFSET + slot_);
    map_.reset();
    hdr_ = nullptr;
    my_slot_ = nullptr;
    data_ = nullptr;
}

uint64_t Consumer::head() const {
    require_open("head");
    return hdr_->head.load(std::memory_order_acquire);
}

PollStatus Consumer::poll(RecordView* out) {
    require_open("poll");
    for (;;) {
        const uint64_t p = position_;
        // SYNC POINT (1) acquire: pairs with the producer's release store of `head`; every
        // record header below head is fully written (RESERVED at least) and visible.
        const uint64_t head = hdr_->head.load(std::memory_order_acquire);
        if (p >= head) return PollStatus::Empty;
        const uint64_t off = p % capacity_;
        auto* h = reinterpret_cast<RecordHeader*>(data_ + off);
        // SYNC POINT (1) acquire: pairs with the producer's release store of COMMITTED (or
        // ABORTED) in commit()/abort(); the payload is complete once we see COMMITTED.
        const uint32_t st = h->state.load(std::memory_order_acquire);
        if (st == STATE_RESERVED) return PollStatus::Empty;  // being written: never read part-way
        if (h->magic != RECORD_MAGIC || h->position != p || h->epoch != epoch_)
            fail(ErrorKind::Ring, "ring '" + name_ + "' corrupt at position " + std::to_string(p) +
                                      ": expected record magic " + hex(RECORD_MAGIC) + ", position " +
                                      std::to_string(p) + ", epoch " + hex(epoch_) + "; found magic " +
                                      hex(h->magic) + ", position " + std::to_string(h->position) + ", epoch " +
                                      hex(h->epoch));
        const uint64_t total = h->total_len;
        if (total < RECORD_HEADER_SIZE || total % RECORD_ALIGN != 0 || off + total > capacity_ ||
            (st != STATE_PADDING && record_total_len(h->payload_len) != total))
            fail(ErrorKind::Ring, "ring '" + name_ + "' corrupt at position " + std::to_string(p) +
                                      ": impossible total_len " + std::to_string(total) + " / payload_len " +
                                      std::to_string(h->payload_len));
        if (st == STATE_PADDING || st == STATE_ABORTED) {
            position_ = p + total;
            // Skipped records hold nothing the user could release. If the user holds nothing
            // (every record returned so far is released), release the skipped space at once;
            // otherwise release() of the last returned record's end extends over it.
            if (released_ >= last_end_) store_released(position_);
            continue;
        }
        if (st != STATE_COMMITTED)
            fail(ErrorKind::Ring, "ring '" + name_ + "' corrupt at position " + std::to_string(p) +
                                      ": expected a record state 1..4, found " + std::to_string(st));
        out->position = p;
        out->end = p + total;
        out->seq = h->seq;
        out->epoch = h->epoch;
        out->tag = h->tag;
        out->payload_len = h->payload_len;
        out->payload = reinterpret_cast<uint8_t*>(h) + RECORD_HEADER_SIZE;
        position_ = last_end_ = p + total;
        return PollStatus::Record;
    }
}

void Consumer::release(uint64_t position) {
    require_open("release");
    if (position <= released_) return;  // monotonic: releasing less is a no-op
    if (position > position_)
        fail(ErrorKind::Value, "Consumer.release(" + std::to_string(position) +
                                   "): expected a position <= the read position " + std::to_string(position_));
    if (my_slot_->state.load(std::memory_order_relaxed) != slot_word(generation_, SLOT_ACTIVE))
        fail(ErrorKind::Ring, "consumer slot " + std::to_string(slot_) + " of '" + name_ +
                                  "' was reclaimed by the producer (our lock was lost)");
    // Releasing the end of the last record poll() returned also releases the padding/aborted
    // records poll() skipped after it (they hold no data).
    store_released(position == last_end_ ? position_ : position);
}

void Consumer::store_released(uint64_t position) {
    released_ = position;
    // SYNC POINT (2) release: our reads of every byte below `position` happen-before the
    // producer's acquire load of `released` and hence before it overwrites them.
    my_slot_->released.store(position, std::memory_order_release);
}

bool Consumer::producer_alive() const {
    require_open("producer_alive");
    return ofd_locked_by_other(map_->fd, PRODUCER_LOCK_OFFSET);
}

// ================================================================================================
// Segment helpers
// ================================================================================================

bool is_stale(const std::string& name) {
    std::string path = shm_path(name);
    int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) fail(ErrorKind::SegmentNotFound, "segment '" + name + "' does not exist");
        if (err == EACCES) fail(ErrorKind::SegmentPermission, "segment '" + name + "': permission denied");
        fail(ErrorKind::Ring, "shm_open('" + name + "') failed: " + errno_text(err));
    }
    bool locked;
    try {
        locked = ofd_locked_by_other(fd, PRODUCER_LOCK_OFFSET);
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return !locked;
}

void unlink_segment(const std::string& name) {
    std::string path = shm_path(name);
    if (shm_unlink(path.c_str()) != 0) {
        int err = errno;
        if (err == ENOENT) fail(ErrorKind::SegmentNotFound, "segment '" + name + "' does not exist");
        if (err == EACCES) fail(ErrorKind::SegmentPermission, "segment '" + name + "': permission denied");
        fail(ErrorKind::Ring, "shm_unlink('" + name + "') failed: " + errno_text(err));
    }
}

SegmentInfo segment_info(const std::string& name) {
    auto m = attach_segment(name, 0);
    auto* hdr = reinterpret_cast<SegmentHeader*>(m->base);
    auto* slots = reinterpret_cast<ConsumerSlot*>(m->base + SLOTS_OFFSET);
    SegmentInfo info;
    info.name = name;
    info.magic = hdr->magic.load(std::memory_order_acquire);
    info.layout_version = hdr->layout_version;
    info.max_consumers = hdr->max_consumers;
    info.epoch = hdr->epoch;
    info.capacity = hdr->capacity;
    info.head = hdr->head.load(std::memory_order_acquire);
    info.map_size = hdr->map_size;
    info.data_offset = hdr->data_offset;
    info.producer_pid = hdr->producer_pid.load(std::memory_order_relaxed);
    info.created_ns = hdr->created_ns;
    info.producer_alive = ofd_locked_by_other(m->fd, PRODUCER_LOCK_OFFSET);
    info.committed = hdr->committed.load(std::memory_order_relaxed);
    info.reserved = hdr->reserved.load(std::memory_order_relaxed);
    info.aborted = hdr->aborted.load(std::memory_order_relaxed);
    info.full_count = hdr->full_count.load(std::memory_order_relaxed);
    info.reaped = hdr->reaped.load(std::memory_order_relaxed);
    info.next_seq = hdr->next_seq.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < hdr->max_consumers; ++i) {
        uint64_t word = slots[i].state.load(std::memory_order_seq_cst);
        if (slot_state(word) == SLOT_FREE && slot_generation(word) == 0) continue;  // never used
        SlotInfo si{};
        si.slot = i;
        si.state = slot_state(word);
        si.generation = slot_generation(word);
        si.released = slots[i].released.load(std::memory_order_acquire);
        si.pid = slots[i].pid.load(std::memory_order_relaxed);
        si.alive = ofd_locked_by_other(m->fd, SLOT_LOCK_OFFSET + i);
        info.consumers.push_back(si);
    }
    return info;
}

}  // namespace hsc
