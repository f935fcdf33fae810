// hscapture shared-memory ring: producer and consumer cores.
//
// Memory-ordering contract (every atomic pair is marked "SYNC POINT" on both sides):
//
//   (1) record publication, producer -> consumer (Aeron: claim / commit by release store):
//       producer writes the RESERVED header, then release-stores `head` past it  ---> consumer
//       acquire-loads `head` and only then reads the header at a position < head.
//       producer writes the payload, then release-stores `state = COMMITTED`     ---> consumer
//       acquire-loads `state` and only reads the payload after seeing COMMITTED.
//       put() writes header (COMMITTED) and payload first and publishes both by the one
//       release store of `head`. A consumer keeps the last `head` it acquired (head_seen_):
//       every header below it stays visible, so it re-loads `head` only once it reaches it.
//   (2) space reclamation, consumer -> producer (Linux perf ring's tail):
//       consumer finishes reading bytes < P, then release-stores `released = P`  ---> producer
//       acquire-loads `released` (inside a seq_cst scan) before overwriting those bytes.
//   (3) consumer registration (seq_cst, see Consumer::register_protocol for the argument):
//       producer: store head (seq_cst) ... then scan slot states (seq_cst);
//       consumer: store slot ACTIVE (seq_cst) ... then load head (seq_cst).
//       The same protocol registers a consumer in a FREE slot and re-registers a durable
//       subscription whose slot EXPIRED (neither bounds the producer before the ACTIVE store).
//   (4) segment initialisation: the creator fills the header, then release-stores `magic`;
//       an attacher acquire-loads `magic` and only then trusts the other header fields.
//   (5) slot ownership changes are seq_cst CASes of the slot's state word, each expecting the
//       exact word (generation included) its author looked at: producer reap (dead anonymous
//       ACTIVE -> FREE), producer expiry (dead durable ACTIVE -> EXPIRED), consumer resume
//       (durable ACTIVE -> ACTIVE, generation + 1), consumer freeing a dead anonymous slot,
//       close/unsubscribe. Every transition bumps the generation, so of two racing CASes on
//       one word exactly one wins and the loser sees the winner's word.
//   (6) slot names (a seqlock without a sequence: the state word is the sequence): a
//       registrant loads FREE, then release-stores the name words and publishes them with its
//       ACTIVE CAS. segment_info acquire-loads the name words of a durable word, then re-loads
//       the word: if any name word came from a later registrant, that registrant's load of
//       FREE happens-before the re-load, which therefore cannot return the old word; so an
//       unchanged word means the name belongs to it. Writers are serialised by the registry
//       OFD lock (held by every registration and resume), so a resume scan reads names no one
//       is writing (and sees them: it acquire-loads the word whose CAS published them).
//   (7) attached_at rides on `released`: a registrant relaxed-stores attached_at, then
//       seq_cst-stores released = h1; a resumer seq_cst-loads released, then relaxed-loads
//       attached_at, and so sees the registrant's value.
//   (8) delivered: only the slot's owner stores it (release, after the acknowledgements it
//       stands for); a registrant of a FREE slot zeroes it before its ACTIVE CAS (3); a
//       resumer acquire-loads it after its own CAS (5) and sees the last owner's value (that
//       owner is dead or detached: its stores are complete). Nothing in the ring is ordered
//       by it; it only tells a resumer which samples past `released` were acknowledged.
//       unsettled is stored by the owner alike (release, any value), zeroed alike, and a
//       resumer acquire-loads it after its CAS; the owner stores a smaller value BEFORE the
//       `released` store (2) that lets the ring pass the chunks it protects, and a larger one
//       only AFTER the `delivered` store that covers them, so whatever pair of values a crash
//       leaves is conservative.
//       read_through (1 + the highest sample number of any entry the owners of the place
//       read) is stored by the owner alike (release, monotonic) BEFORE each `released`
//       store (2): a record the ring may pass has its numbers below it, so a resumer that
//       acquire-loads it after its CAS knows every number at or above it is either in the
//       ring past `released` or was never committed (reported lost when the incarnation
//       retires). Zeroed alike; an EXPIRED slot of our name keeps it, as `delivered`.
//   (9) taken: only the producer stores it (release, monotonic, as it takes sample numbers);
//       a consumer acquire-loads it when it retires the incarnation, after the producer is
//       gone. It publishes nothing else: it only bounds the numbers a retirer reports lost.
//
// Liveness is not in shared memory at all: each party holds an OFD lock (fcntl F_OFD_SETLK)
// on one byte of the segment file; the kernel drops it when the process dies, and anyone can
// ask with F_OFD_GETLK. So a crashed anonymous consumer frees its slot without any timeout,
// and a durable subscription is "detached" (owner gone, place kept) exactly when its lock is
// free.

#include "hscapture/ring.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>

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

uint64_t monotonic_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

// Blocking OFD write lock on one byte (cold path: registration only).
void ofd_lock_wait(int fd, uint64_t offset) {
    struct flock fl = one_byte(F_WRLCK, offset);
    while (fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
        if (errno == EINTR) continue;
        fail(ErrorKind::Ring, "fcntl(F_OFD_SETLKW) failed: " + errno_text(errno));
    }
}

// The registry lock, held while a consumer registers or resumes (scoped). It only provides
// mutual exclusion (one registrant at a time per segment); every slot field is atomic and
// ordered by the SYNC POINTs, not by this lock.
class RegistryLock {
public:
    explicit RegistryLock(int fd) : fd_(fd) { ofd_lock_wait(fd_, REGISTRY_LOCK_OFFSET); }
    ~RegistryLock() { ofd_unlock(fd_, REGISTRY_LOCK_OFFSET); }
    RegistryLock(const RegistryLock&) = delete;
    RegistryLock& operator=(const RegistryLock&) = delete;

private:
    int fd_;
};

constexpr std::size_t NAME_WORDS = SLOT_NAME_LEN / sizeof(uint64_t);

// Only a registrant holding the registry lock and the slot's lock, on a FREE slot.
// SYNC POINT (6) release stores: pair with load_slot_name's acquire loads (segment_info).
void store_slot_name(ConsumerSlot& s, const std::string& name) {
    uint64_t w[NAME_WORDS] = {};
    std::memcpy(w, name.data(), std::min(name.size(), SLOT_NAME_LEN - 1));
    for (std::size_t k = 0; k < NAME_WORDS; ++k) s.name[k].store(w[k], std::memory_order_release);
}

// SYNC POINT (6) acquire loads: pair with store_slot_name's release stores; a caller without
// the registry lock re-loads the state word afterwards (segment_info).
std::string load_slot_name(const ConsumerSlot& s) {
    uint64_t w[NAME_WORDS];
    for (std::size_t k = 0; k < NAME_WORDS; ++k) w[k] = s.name[k].load(std::memory_order_acquire);
    char buf[SLOT_NAME_LEN];
    std::memcpy(buf, w, SLOT_NAME_LEN);
    return std::string(buf, strnlen(buf, SLOT_NAME_LEN));
}

#ifdef HSC_SHARE_MAPPINGS_IN_PROCESS
// ThreadSanitizer build only: TSan tracks memory by virtual address, so two mappings of one
// segment in one process would hide every race between them. The producer registers its
// mapping here and a consumer of the same file (st_dev, st_ino) reuses it.
std::mutex g_maps_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<Mapping>> g_maps;
#endif

// true if an open file description other than `fd`'s holds a lock on the byte.
bool ofd_locked_by_other(int fd, uint64_t offset) {
    struct flock fl = one_byte(F_WRLCK, offset);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        fail(ErrorKind::Ring, "fcntl(F_OFD_GETLK) failed: " + errno_text(errno));
    return fl.l_type != F_UNLCK;
}

enum class AttachMode {
    Consumer,    // whole segment; data region read-only (mprotect), header and slots writable
    HeaderOnly,  // header and slots only, read-only (segment_info)
};

// Opens an existing segment, checks ownership and mode, maps it, checks magic/version/epoch.
std::shared_ptr<Mapping> attach_segment(const std::string& name, uint64_t expected_epoch, AttachMode mode) {
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
    unsigned mode_bits = unsigned(st.st_mode & 07777);
    if (mode_bits != 0600) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "has mode 0%o: expected mode 0600", mode_bits);
        fail(ErrorKind::SegmentPermission, "segment '" + name + "' " + buf);
    }
    const uint64_t file_size = uint64_t(st.st_size);
    if (file_size < HEADER_SIZE + PAGE_SIZE)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "' is " + std::to_string(st.st_size) +
                                            " bytes: expected at least " + std::to_string(HEADER_SIZE + PAGE_SIZE) +
                                            " (not an hscapture ring, or not initialised yet)");
    bool aliased = false;
#ifdef HSC_SHARE_MAPPINGS_IN_PROCESS
    if (mode == AttachMode::Consumer) {
        std::lock_guard<std::mutex> g(g_maps_mu);
        auto it = g_maps.find({st.st_dev, st.st_ino});
        if (it != g_maps.end())
            if (auto orig = it->second.lock(); orig && orig->size == file_size) {
                m->alias_of = orig;
                m->base = orig->base;
                m->size = orig->size;
                aliased = true;
            }
    }
#endif
    if (!aliased) {
        const std::size_t len =
            mode == AttachMode::HeaderOnly ? std::min<uint64_t>(file_size, data_offset(MAX_CONSUMERS)) : file_size;
        const int prot = mode == AttachMode::HeaderOnly ? PROT_READ : PROT_READ | PROT_WRITE;
        const int flags = MAP_SHARED | (mode == AttachMode::HeaderOnly ? 0 : MAP_POPULATE);
        void* p = mmap(nullptr, len, prot, flags, fd, 0);
        if (p == MAP_FAILED) fail(ErrorKind::Ring, "mmap of segment '" + name + "' failed: " + errno_text(errno));
        m->base = static_cast<uint8_t*>(p);
        m->size = len;
    }
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
    if (hdr->map_size != file_size || hdr->max_consumers == 0 || hdr->max_consumers > MAX_CONSUMERS ||
        hdr->data_offset != data_offset(hdr->max_consumers) || hdr->capacity % RECORD_ALIGN != 0 ||
        hdr->data_offset + hdr->capacity > hdr->map_size || hdr->control_reserve >= hdr->capacity / 2)
        fail(ErrorKind::LayoutMismatch, "segment '" + name + "': inconsistent header (map_size " +
                                            std::to_string(hdr->map_size) + ", file size " + std::to_string(file_size) +
                                            ", capacity " + std::to_string(hdr->capacity) + ", control_reserve " +
                                            std::to_string(hdr->control_reserve) + ")");
    // Consumers only read the data region: make a stray write through a payload pointer fault
    // here instead of corrupting a record every other consumer reads. (Skipped when the
    // mapping is the producer's own, in the ThreadSanitizer build.)
    if (mode == AttachMode::Consumer && !aliased &&
        mprotect(m->base + hdr->data_offset, m->size - hdr->data_offset, PROT_READ) != 0)
        fail(ErrorKind::Ring, "mprotect(PROT_READ) of the data region of '" + name + "' failed: " + errno_text(errno));
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
        case ErrorKind::SubscriptionNotFound: return "SubscriptionNotFoundError";
        case ErrorKind::SubscriptionInUse: return "SubscriptionInUseError";
        case ErrorKind::Value: return "ValueError";
    }
    return "RingError";
}

Mapping::~Mapping() {
    if (base && !alias_of) munmap(base, size);
    if (fd >= 0) ::close(fd);
}

// ================================================================================================
// Producer
// ================================================================================================

Producer::Producer(const std::string& name, uint64_t capacity, uint32_t max_consumers, uint64_t epoch,
                   uint64_t control_reserve)
    : name_(name), capacity_(capacity), control_reserve_(control_reserve), max_consumers_(max_consumers),
      owner_pid_(int64_t(getpid())) {
    std::string path = shm_path(name);
    if (capacity < 2 * RECORD_ALIGN || capacity % RECORD_ALIGN != 0 || capacity > (uint64_t(1) << 50))
        fail(ErrorKind::Value, "capacity " + std::to_string(capacity) + ": expected a multiple of " +
                                   std::to_string(RECORD_ALIGN) + " between " + std::to_string(2 * RECORD_ALIGN) +
                                   " and 2**50");
    if (max_consumers == 0 || max_consumers > MAX_CONSUMERS)
        fail(ErrorKind::Value, "max_consumers " + std::to_string(max_consumers) + ": expected 1.." +
                                   std::to_string(MAX_CONSUMERS));
    if (control_reserve >= capacity / 2)  // capacity is even (a multiple of 64)
        fail(ErrorKind::Value, "control_reserve " + std::to_string(control_reserve) +
                                   ": expected less than capacity / 2 (capacity " + std::to_string(capacity) + ")");
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
    hdr_->control_reserve = control_reserve;
    hdr_->head.store(0, std::memory_order_relaxed);
    // SYNC POINT (4) release: publishes every header field above to attachers, which
    // acquire-load `magic` before reading anything else.
    hdr_->magic.store(MAGIC, std::memory_order_release);
#ifdef HSC_SHARE_MAPPINGS_IN_PROCESS
    {
        struct stat st{};
        if (fstat(m->fd, &st) == 0) {
            std::lock_guard<std::mutex> g(g_maps_mu);
            g_maps[{st.st_dev, st.st_ino}] = m;
        }
    }
#endif
    map_ = std::move(m);
}

Producer::~Producer() { close(true); }

void Producer::require_open(const char* op) const {
    if (!map_) fail(ErrorKind::Ring, std::string("Producer.") + op + ": the producer of '" + name_ + "' is closed");
}

void Producer::close(bool unlink) {
    std::lock_guard<std::mutex> guard(mu_);
    if (!map_) return;
    // A forked child closing (or destroying) the producer object it inherited: the segment,
    // its lock (shared with the parent: one open file description) and its name are the
    // parent's, still in use. Only the child's mapping and descriptor go (closing a
    // descriptor keeps an OFD lock that another descriptor of the description holds).
    if (int64_t(getpid()) == owner_pid_) {
        ofd_unlock(map_->fd, PRODUCER_LOCK_OFFSET);
        if (unlink) shm_unlink(shm_path(name_).c_str());
    }
    map_.reset();  // unmapped once the last payload view dies
    hdr_ = nullptr;
    slots_ = nullptr;
    data_ = nullptr;
}

// A dead or detached durable slot may be EXPIRED once it has blocked reservations, with the
// same state word, for expiry_ns (counted from the first scan that found it blocking).
bool Producer::expiry_due(uint32_t i, uint64_t word, uint64_t expiry_ns) {
    if (dead_since_.size() < max_consumers_) dead_since_.assign(max_consumers_, {0, 0});
    auto& seen = dead_since_[i];
    const uint64_t now = monotonic_ns();
    if (seen.first != word || seen.second == 0) {
        seen = {word, now};
        return false;
    }
    return now - seen.second >= expiry_ns;
}

// Returns the reuse limit: min `released` over ACTIVE slots (head_ if there are none). A slot
// blocks when rel + capacity < end_eff (end_eff = the reservation's end plus the headroom it
// must leave). Dead anonymous slots are freed (Reserve: those that block; ReapAll: all); dead
// or detached durable slots are never freed, only EXPIRED (Reserve, expiry on, blocking long
// enough). FREE and EXPIRED slots bound nothing.
uint64_t Producer::scan_consumers(uint64_t end_eff, ScanMode mode, int* reaped) {
    uint64_t limit = head_;
    const uint64_t expiry_ns = durable_expiry_ns_.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < max_consumers_; ++i) {
        ConsumerSlot& s = slots_[i];
        // SYNC POINT (3) seq_cst: this load is ordered after our seq_cst store of `head` in the
        // previous reserve; a consumer whose ACTIVE store we miss here will read a head at least
        // that large (see Consumer::register_protocol).
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) != SLOT_ACTIVE) continue;
        // SYNC POINT (2) acquire (seq_cst): pairs with the consumer's release store of
        // `released`; its reads of bytes below this value are complete before we reuse them.
        uint64_t rel = s.released.load(std::memory_order_seq_cst);
        const bool blocks = rel + capacity_ < end_eff;
        const bool durable = slot_durable(word);
        const bool look = mode == ScanMode::Reserve ? blocks && (!durable || expiry_ns != 0)
                          : mode == ScanMode::ReapAll ? !durable
                                                      : false;
        if (look && !ofd_locked_by_other(map_->fd, SLOT_LOCK_OFFSET + i)) {
            // Its owner is gone (the kernel dropped the lock, or it detached). Change the slot
            // only if it still holds the word we looked at: a consumer that re-claimed or
            // resumed it meanwhile bumped the generation, and our CAS then fails.
            uint64_t next = 0;
            std::atomic<uint64_t> SegmentHeader::*counter = nullptr;
            if (!durable) {
                next = slot_word(slot_generation(word) + 1, SLOT_FREE);
                counter = &SegmentHeader::reaped;
            } else if (expiry_due(i, word, expiry_ns)) {
                next = slot_word(slot_generation(word) + 1, SLOT_EXPIRED, true);
                counter = &SegmentHeader::expired;
            }
            if (counter) {
                // SYNC POINT (5) seq_cst CAS: against a consumer's resume / re-registration CAS.
                if (s.state.compare_exchange_strong(word, next, std::memory_order_seq_cst)) {
                    (hdr_->*counter).fetch_add(1, std::memory_order_relaxed);
                    if (reaped && !durable) ++*reaped;
                    continue;
                }
                if (slot_state(word) != SLOT_ACTIVE) continue;
                rel = s.released.load(std::memory_order_seq_cst);  // re-claimed: count the new one
            }
        }
        if (rel < limit) limit = rel;
    }
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

// Under mu_: where a record of `payload_len` goes. Returns its position (and `*end`, the head
// after it, padding included) or RESERVE_FULL / RESERVE_TOO_LARGE; writes the padding header a
// wrap needs (the caller's store of head publishes it). Writes no record header.
int64_t Producer::place_locked(uint64_t payload_len, bool control, uint64_t* end_out) {
    // A data record must leave control_reserve bytes free after it; a control record may use
    // the whole ring. `avail` is how much of the ring this reservation may occupy.
    const uint64_t avail = control ? capacity_ : capacity_ - control_reserve_;
    if (payload_len > avail || record_total_len(payload_len) > avail) return RESERVE_TOO_LARGE;
    const uint64_t total = record_total_len(payload_len);
    const uint64_t p = head_;
    const uint64_t off = p % capacity_;
    const uint64_t pad = off + total > capacity_ ? capacity_ - off : 0;
    const uint64_t end = p + pad + total;
    // Bytes [end - capacity, end) of the previous lap get overwritten: all live consumers must
    // have released up to end - capacity, and no record of ours may still be uncommitted there
    // (its copy may be in flight); a data record needs capacity - avail more on top. Re-scan
    // consumers only when the cached limit says "full".
    const uint64_t floor = inflight_.empty() ? UINT64_MAX : inflight_.front().first;
    if (end > std::min(limit_, floor) + avail) {
        limit_ = scan_consumers(end + (capacity_ - avail), ScanMode::Reserve, nullptr);
        const uint64_t lim = std::min(limit_, floor);
        if (end > lim + avail) {
            hdr_->full_count.fetch_add(1, std::memory_order_relaxed);
            if (control) hdr_->control_full.fetch_add(1, std::memory_order_relaxed);
            // The record does not fit, but if the padding alone does (leaving the headroom a
            // data record must leave), publish it now: the head moves to offset 0, so once
            // consumers release the padding the record can fit. If we waited, a record larger
            // than the free space left of the wrap point could never be placed even in an empty
            // ring (nobody would ever release more).
            if (pad != 0 && p + pad <= lim + avail) {
                write_padding(p, off, pad);
                head_ = p + pad;
                // SYNC POINT (1) release: publishes the PADDING header (see reserve()).
                hdr_->head.store(head_, std::memory_order_seq_cst);
            }
            return RESERVE_FULL;
        }
    }
    if (pad != 0) write_padding(p, off, pad);
    *end_out = end;
    return int64_t(p + pad);
}

// Under mu_: the record header at `pos` in `state`, consuming a sequence number. Published by
// the caller's release store of head.
RecordHeader* Producer::write_header_locked(uint64_t pos, uint64_t payload_len, uint64_t tag, uint32_t state) {
    auto* h = reinterpret_cast<RecordHeader*>(data_ + pos % capacity_);
    h->magic = RECORD_MAGIC;
    h->epoch = epoch_;
    h->seq = seq_;
    h->payload_len = payload_len;
    h->total_len = record_total_len(payload_len);
    h->position = pos;
    h->tag = tag;
    h->reserved = 0;
    h->state.store(state, std::memory_order_relaxed);
    ++seq_;
    hdr_->next_seq.store(seq_, std::memory_order_relaxed);
    return h;
}

int64_t Producer::reserve(uint64_t payload_len, uint64_t tag, bool control) {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("reserve");
    uint64_t end = 0;
    const int64_t pos = place_locked(payload_len, control, &end);
    if (pos < 0) return pos;
    // RESERVED: published by the release store of head below; COMMITTED comes later by its own
    // release (commit()), so a consumer may see the record RESERVED and wait for it.
    write_header_locked(uint64_t(pos), payload_len, tag, STATE_RESERVED);
    head_ = end;
    // SYNC POINT (1) release: publishes the RESERVED (and PADDING) headers written above to
    // consumers, which acquire-load `head` before reading any header below it.
    // SYNC POINT (3) seq_cst: ordered before the slot scan of our next reserve (registration).
    hdr_->head.store(end, std::memory_order_seq_cst);
    hdr_->reserved.fetch_add(1, std::memory_order_relaxed);
    inflight_.emplace_back(uint64_t(pos), false);
    return pos;
}

int64_t Producer::put(const void* src, uint64_t len, uint64_t tag, bool control) {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("put");
    uint64_t end = 0;
    const int64_t pos = place_locked(len, control, &end);
    if (pos < 0) return pos;
    // COMMITTED at once, the payload copied before head moves: a consumer never sees this record
    // RESERVED, so it never reads (and pulls across cores) a header the producer writes again.
    RecordHeader* h = write_header_locked(uint64_t(pos), len, tag, STATE_COMMITTED);
    std::memcpy(reinterpret_cast<uint8_t*>(h) + RECORD_HEADER_SIZE, src, len);
    head_ = end;
    // SYNC POINT (1) release: publishes the COMMITTED header and the payload bytes (and any
    // PADDING header) to consumers, which acquire-load `head` before reading below it.
    // SYNC POINT (3) seq_cst: as in reserve().
    hdr_->head.store(end, std::memory_order_seq_cst);
    hdr_->reserved.fetch_add(1, std::memory_order_relaxed);
    hdr_->committed.fetch_add(1, std::memory_order_relaxed);
    return pos;
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

void Producer::store_taken(uint64_t n) {
    require_open("store_taken");
    // Only this producer writes `taken`, its caller serializing the calls: a relaxed load of
    // our own last store suffices for the monotonic check.
    if (n <= hdr_->taken.load(std::memory_order_relaxed)) return;
    // SYNC POINT (9) release: pairs with Consumer::taken's acquire load; a retiring consumer
    // reads it after the producer is gone (no record or other field is published by it).
    hdr_->taken.store(n, std::memory_order_release);
}

int Producer::reap() {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("reap");
    int n = 0;
    limit_ = scan_consumers(0, ScanMode::ReapAll, &n);
    return n;
}

ProducerStats Producer::stats() {
    std::lock_guard<std::mutex> guard(mu_);
    require_open("stats");
    const uint64_t min_rel = scan_consumers(0, ScanMode::Peek, nullptr);
    uint64_t live = 0, detached = 0, expired = 0;
    for (uint32_t i = 0; i < max_consumers_; ++i) {
        const uint64_t word = slots_[i].state.load(std::memory_order_seq_cst);
        if (slot_state(word) == SLOT_EXPIRED) {
            ++expired;
        } else if (slot_state(word) == SLOT_ACTIVE) {
            if (ofd_locked_by_other(map_->fd, SLOT_LOCK_OFFSET + i))
                ++live;
            else if (slot_durable(word))
                ++detached;  // (a dead anonymous slot not reaped yet counts nowhere)
        }
    }
    return ProducerStats{hdr_->committed.load(std::memory_order_relaxed),
                         hdr_->reserved.load(std::memory_order_relaxed),
                         hdr_->aborted.load(std::memory_order_relaxed),
                         hdr_->full_count.load(std::memory_order_relaxed),
                         hdr_->control_full.load(std::memory_order_relaxed),
                         hdr_->reaped.load(std::memory_order_relaxed),
                         hdr_->expired.load(std::memory_order_relaxed),
                         min_rel,
                         live,
                         detached,
                         expired,
                         head_,
                         seq_};
}

// ================================================================================================
// Consumer
// ================================================================================================

Consumer::Consumer(const std::string& name, uint64_t expected_epoch, const std::string& resume_name,
                   bool resume_only)
    : name_(name), resume_name_(resume_name), owner_pid_(int64_t(getpid())) {
    if (resume_name.size() >= SLOT_NAME_LEN)
        fail(ErrorKind::Value, "resume name '" + resume_name + "': expected at most " +
                                   std::to_string(SLOT_NAME_LEN - 1) + " bytes");
    if (resume_name.find('\0') != std::string::npos)
        fail(ErrorKind::Value, "resume name: expected no NUL byte");
    if (resume_only && resume_name.empty())
        fail(ErrorKind::Value, "resume_only=True needs a resume_name: expected a non-empty name");
    auto m = attach_segment(name, expected_epoch, AttachMode::Consumer);
    hdr_ = reinterpret_cast<SegmentHeader*>(m->base);
    epoch_ = hdr_->epoch;
    capacity_ = hdr_->capacity;
    data_ = m->base + hdr_->data_offset;
    auto* slots = reinterpret_cast<ConsumerSlot*>(m->base + SLOTS_OFFSET);
    const uint32_t n = hdr_->max_consumers;
    map_ = m;  // our lock fd for the helpers below; reset again if we throw
    try {
        // One registrant at a time per segment: names are written only under this lock, and
        // two consumers resuming or creating the same name cannot both succeed.
        RegistryLock registry(m->fd);
        if (!resume_name_.empty() && resume_locked(slots, n)) return;
        if (resume_only)
            fail(ErrorKind::SubscriptionNotFound,
                 "segment '" + name + "' has no subscription under resume name '" + resume_name +
                     "': expected one registered earlier (resume_only=True creates none)");
        register_locked(slots, n);
    } catch (...) {
        map_.reset();  // closing our description drops any slot lock we took
        hdr_ = nullptr;
        data_ = nullptr;
        throw;
    }
}

// Takes over the slot registered under resume_name_ if there is one (caller holds the registry
// lock). Returns false if there is none.
bool Consumer::resume_locked(ConsumerSlot* slots, uint32_t n) {
    const int fd = map_->fd;
    for (uint32_t i = 0; i < n; ++i) {
        ConsumerSlot& s = slots[i];
        // SYNC POINT (6) seq_cst load: pairs with the ACTIVE CAS that published the name (and
        // the names are stable: only registry-lock holders write them, and we hold it).
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) == SLOT_FREE || !slot_durable(word) || load_slot_name(s) != resume_name_) continue;
        if (!ofd_trylock(fd, SLOT_LOCK_OFFSET + i)) {
            word = s.state.load(std::memory_order_seq_cst);
            if (slot_state(word) == SLOT_FREE) continue;  // unsubscribed just now
            fail(ErrorKind::SubscriptionInUse,
                 "segment '" + name_ + "': the subscription '" + resume_name_ + "' (slot " + std::to_string(i) +
                     ") is held by a live consumer (pid " + std::to_string(s.pid.load(std::memory_order_relaxed)) +
                     "): expected it detached or dead (one live consumer per durable subscription)");
        }
        word = s.state.load(std::memory_order_seq_cst);
        for (;;) {
            if (slot_state(word) == SLOT_FREE) break;  // its owner unsubscribed before we locked
            const uint64_t mine = slot_word(slot_generation(word) + 1, SLOT_ACTIVE, true);
            if (slot_state(word) == SLOT_ACTIVE) {
                // SYNC POINT (5) seq_cst CAS: the generation bump makes the producer's expiry CAS
                // (which expects `word`) fail; if the producer expired the slot first, this CAS
                // fails, `word` becomes EXPIRED and we re-register below.
                if (!s.state.compare_exchange_strong(word, mine, std::memory_order_seq_cst)) continue;
                s.pid.store(uint64_t(getpid()), std::memory_order_relaxed);
                my_slot_ = &s;
                my_word_ = mine;
                // SYNC POINT (2) seq_cst load: pairs with the previous owner's release stores of
                // `released`; every byte from here on is intact (the slot bounded the producer).
                position_ = released_ = last_end_ = s.released.load(std::memory_order_seq_cst);
                lost_from_ = lost_to_ = position_;
            } else {  // EXPIRED: the producer reused our unread bytes; start afresh at its head
                lost_from_ = s.released.load(std::memory_order_seq_cst);
                s.pid.store(uint64_t(getpid()), std::memory_order_relaxed);
                my_slot_ = &s;
                lost_to_ = register_protocol(s, word);
                position_ = released_ = last_end_ = lost_to_;
                expired_ = true;
            }
            slot_ = i;
            // SYNC POINT (7): after our load of `released` above; the original attach position.
            attached_at_ = s.attached_at.load(std::memory_order_relaxed);
            resumed_ = true;
            return true;
        }
        ofd_unlock(fd, SLOT_LOCK_OFFSET + i);
    }
    return false;
}

// Registers a new slot: a FREE one, or a dead ANONYMOUS one after freeing it. A durable slot
// (ACTIVE or EXPIRED) of any other name is never taken. Caller holds the registry lock.
void Consumer::register_locked(ConsumerSlot* slots, uint32_t n) {
    const int fd = map_->fd;
    uint32_t live = 0, durable = 0, expired = 0;
    for (uint32_t i = 0; i < n; ++i) {
        ConsumerSlot& s = slots[i];
        uint64_t word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) == SLOT_EXPIRED) {
            ++expired;
            continue;
        }
        if (slot_state(word) == SLOT_ACTIVE && slot_durable(word)) {
            ++durable;
            continue;
        }
        // Our own open file description (fresh shm_open): the lock identifies us.
        if (!ofd_trylock(fd, SLOT_LOCK_OFFSET + i)) {
            ++live;  // a live anonymous consumer (or a registrant's brief try) holds it
            continue;
        }
        word = s.state.load(std::memory_order_seq_cst);
        if (slot_state(word) == SLOT_ACTIVE && !slot_durable(word)) {
            // A dead anonymous consumer: free its slot first. SYNC POINT (5) seq_cst CAS: the
            // producer may be reaping the same word; whichever CAS loses sees FREE.
            const uint64_t freed = slot_word(slot_generation(word) + 1, SLOT_FREE);
            if (s.state.compare_exchange_strong(word, freed, std::memory_order_seq_cst)) word = freed;
        }
        if (slot_state(word) != SLOT_FREE) {  // cannot happen under the registry lock; be safe
            ofd_unlock(fd, SLOT_LOCK_OFFSET + i);
            continue;
        }
        s.pid.store(uint64_t(getpid()), std::memory_order_relaxed);
        // SYNC POINT (6) release stores, after our load of FREE above: a segment_info reader
        // that sees any word of the name re-loads a state word no older than that FREE, so it
        // discards a name read across our write.
        store_slot_name(s, resume_name_);
        slot_ = i;
        my_slot_ = &s;
        const uint64_t h1 = register_protocol(s, word);
        position_ = released_ = last_end_ = lost_from_ = lost_to_ = h1;
        return;
    }
    fail(ErrorKind::ConsumerSlotsExhausted,
         "segment '" + name_ + "': all " + std::to_string(n) + " consumer slots are taken (" + std::to_string(live) +
             " by live anonymous consumers, " + std::to_string(durable) + " by durable subscriptions, live or detached, " +
             std::to_string(expired) + " by expired durable subscriptions): expected a free slot (unsubscribe() a "
             "durable subscription to free its slot)");
}

// Publishes slot `s` (state word `word`: FREE, or EXPIRED of our own name) as ours, ACTIVE,
// and returns the position we start reading at. We hold the slot's lock.
//
// Registration race, and why it is safe.
//
// 1. h0 = head (seq_cst); released = h0.
// 2. state = ACTIVE with a new generation (seq_cst CAS).
// 3. h1 = head (seq_cst); released = h1; we start reading at h1.
//
// The producer, in reserve(), stores head (seq_cst) and, in a later reserve that would be full,
// scans the slot states (seq_cst). Suppose a scan missed our ACTIVE store. Then in the single
// total order S of seq_cst operations that scan's load precedes our store (2), which precedes
// our load (3); the producer's head store that preceded the scan in program order precedes the
// scan in S. So our load (3) returns at least the head H the producer had when it scanned. The
// limit L computed by that scan is a min of released values (or the head itself with no
// consumers), all <= H <= h1. Reservations made with limit L only overwrite bytes at positions
// < L <= h1, and we never read below h1. A scan that did see ACTIVE also sees released >= h0
// (stored before (2)), so it never lets the producer overwrite anything at or above h0 <= h1
// without our release. Neither FREE nor EXPIRED bounds the producer, so the argument is the
// same for both starting states. The generation bump in (2) makes a concurrent reaper's CAS
// (which expects an older word) fail instead of changing the slot under us.
uint64_t Consumer::register_protocol(ConsumerSlot& s, uint64_t word) {
    const bool durable = !resume_name_.empty();
    const bool fresh = slot_state(word) == SLOT_FREE;
    const uint64_t h0 = hdr_->head.load(std::memory_order_seq_cst);
    s.released.store(h0, std::memory_order_seq_cst);
    if (fresh) s.attached_at.store(h0, std::memory_order_relaxed);  // h1 below; h0 if we die between
    // SYNC POINT (8): a new subscription has acknowledged nothing (an EXPIRED slot of our name
    // keeps its value: its numbers are this segment's, and acknowledged stays acknowledged)
    if (fresh) s.delivered.store(0, std::memory_order_relaxed);
    if (fresh) s.unsettled.store(0, std::memory_order_relaxed);
    if (fresh) s.read_through.store(0, std::memory_order_relaxed);
    uint64_t mine;
    do {
        mine = slot_word(slot_generation(word) + 1, SLOT_ACTIVE, durable);
        // SYNC POINT (3) seq_cst: our ACTIVE store, ordered before the head load below.
        // SYNC POINT (6): this CAS also publishes the name stored before it.
    } while (!s.state.compare_exchange_weak(word, mine, std::memory_order_seq_cst));
    my_word_ = mine;
    // SYNC POINT (3) seq_cst: sees at least the head the producer stored before any scan that
    // missed our ACTIVE store.
    const uint64_t h1 = hdr_->head.load(std::memory_order_seq_cst);
    // SYNC POINT (7): attached_at before `released`; a resumer that loads our released value
    // (or a later one) sees this attached_at.
    if (fresh) s.attached_at.store(h1, std::memory_order_relaxed);
    s.released.store(h1, std::memory_order_seq_cst);
    if (fresh) attached_at_ = h1;
    return h1;
}

Consumer::~Consumer() { close(); }

void Consumer::require_open(const char* op) const {
    if (!map_) fail(ErrorKind::Ring, std::string("Consumer.") + op + ": the consumer of '" + name_ + "' is closed");
}

// Gives our slot back: free_it = FREE it (anonymous close, unsubscribe), else leave it ACTIVE
// with its name and released position (durable detach). Then drops the lock and the mapping.
void Consumer::release_slot(bool free_it) {
    if (!map_) return;
    // A forked child closing the consumer it inherited: the slot and its lock (one open file
    // description with the parent's) are the parent's, still reading. Freeing the slot or
    // unlocking let the producer reclaim it and overwrite records the parent had not read
    // (fault hunt of 2026-12-06: 511 of 600 samples named nowhere). Only the child's mapping
    // and descriptor go.
    const bool ours = int64_t(getpid()) == owner_pid_;
    if (free_it && ours) {
        uint64_t word = my_word_;
        // SYNC POINT (5) seq_cst CAS: fails only if the slot is no longer ours (never while we
        // hold its lock: nobody changes a live consumer's slot).
        my_slot_->state.compare_exchange_strong(word, slot_word(slot_generation(my_word_) + 1, SLOT_FREE),
                                                std::memory_order_seq_cst);
    }
    // The mapping keeps the open file description alive while payload views exist, and an OFD
    // lock lives as long as its description: unlock explicitly so the slot is free right now.
    if (ours) ofd_unlock(map_->fd, SLOT_LOCK_OFFSET + slot_);
    map_.reset();
    hdr_ = nullptr;
    my_slot_ = nullptr;
    data_ = nullptr;
}

void Consumer::close() { release_slot(!durable()); }

void Consumer::unsubscribe() {
    require_open("unsubscribe");
    release_slot(true);
}

uint64_t Consumer::head() const {
    require_open("head");
    return hdr_->head.load(std::memory_order_acquire);
}

PollStatus Consumer::poll(RecordView* out) {
    require_open("poll");
    for (;;) {
        const uint64_t p = position_;
        if (p >= head_seen_) {
            // SYNC POINT (1) acquire: pairs with the producer's release store of `head`; every
            // record header below head is fully written (RESERVED at least) and visible, and
            // stays so for every later poll below this value (head_seen_).
            head_seen_ = hdr_->head.load(std::memory_order_acquire);
            if (p >= head_seen_) return PollStatus::Empty;
        }
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

PollStatus Consumer::take(uint8_t* dst, uint64_t capacity, RecordView* out) {
    const uint64_t last_end = last_end_;
    const PollStatus st = poll(out);
    if (st != PollStatus::Record) return st;
    if (out->payload_len > capacity) {
        // Not taken: step back so poll() returns this record again. Padding/aborted records
        // poll() skipped before it stay skipped (already released or covered by the next
        // release, as in poll()); position_ >= released_ holds since the record is unreleased.
        position_ = out->position;
        last_end_ = last_end;
        out->payload = nullptr;
        return PollStatus::TooSmall;
    }
    // The payload is stable: the producer reuses the space only after release() below
    // publishes it (SYNC POINT (2) in store_released).
    std::memcpy(dst, out->payload, out->payload_len);
    release(out->end);
    out->payload = nullptr;
    return PollStatus::Record;
}

void Consumer::release(uint64_t position) {
    require_open("release");
    if (position <= released_) return;  // monotonic: releasing less is a no-op
    if (position > position_)
        fail(ErrorKind::Value, "Consumer.release(" + std::to_string(position) +
                                   "): expected a position <= the read position " + std::to_string(position_));
    if (my_slot_->state.load(std::memory_order_relaxed) != my_word_)
        fail(ErrorKind::Ring, "consumer slot " + std::to_string(slot_) + " of '" + name_ +
                                  "' was reclaimed by the producer (our lock was lost)");
    // Releasing the end of the last record poll() returned also releases the padding/aborted
    // records poll() skipped after it (they hold no data).
    store_released(position == last_end_ ? position_ : position);
}

uint64_t Consumer::delivered() const {
    require_open("delivered");
    // SYNC POINT (8) acquire: the previous owner's last store (it is gone).
    return my_slot_->delivered.load(std::memory_order_acquire);
}

void Consumer::store_delivered(uint64_t value) {
    require_open("store_delivered");
    if (resume_name_.empty()) return;   // anonymous: nobody resumes it
    // SYNC POINT (8) release, monotonic: only we store it while we own the slot
    if (value > my_slot_->delivered.load(std::memory_order_relaxed))
        my_slot_->delivered.store(value, std::memory_order_release);
}

uint64_t Consumer::unsettled() const {
    require_open("unsettled");
    // SYNC POINT (8) acquire: the previous owner's last store (it is gone).
    return my_slot_->unsettled.load(std::memory_order_acquire);
}

void Consumer::store_unsettled(uint64_t value) {
    require_open("store_unsettled");
    if (resume_name_.empty()) return;   // anonymous: nobody resumes it
    // SYNC POINT (8) release: before the released store (2) it must precede, when smaller
    my_slot_->unsettled.store(value, std::memory_order_release);
}

uint64_t Consumer::read_through() const {
    require_open("read_through");
    // SYNC POINT (8) acquire: the previous owner's last store (it is gone).
    return my_slot_->read_through.load(std::memory_order_acquire);
}

void Consumer::store_read_through(uint64_t value) {
    require_open("store_read_through");
    if (resume_name_.empty()) return;   // anonymous: nobody resumes it
    // SYNC POINT (8) release, monotonic: before the released store (2) that passes the
    // records whose numbers it covers
    if (value > my_slot_->read_through.load(std::memory_order_relaxed))
        my_slot_->read_through.store(value, std::memory_order_release);
}

void Consumer::store_released(uint64_t position) {
    released_ = position;
    // SYNC POINT (2) release: our reads of every byte below `position` happen-before the
    // producer's acquire load of `released` and hence before it overwrites them.
    my_slot_->released.store(position, std::memory_order_release);
}

uint64_t Consumer::taken() const {
    require_open("taken");
    // SYNC POINT (9) acquire: pairs with Producer::store_taken's release store.
    return hdr_->taken.load(std::memory_order_acquire);
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
    auto m = attach_segment(name, 0, AttachMode::HeaderOnly);
    auto* hdr = reinterpret_cast<SegmentHeader*>(m->base);
    auto* slots = reinterpret_cast<ConsumerSlot*>(m->base + SLOTS_OFFSET);
    SegmentInfo info;
    info.name = name;
    info.magic = hdr->magic.load(std::memory_order_acquire);
    info.layout_version = hdr->layout_version;
    info.max_consumers = hdr->max_consumers;
    info.epoch = hdr->epoch;
    info.capacity = hdr->capacity;
    info.control_reserve = hdr->control_reserve;
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
    info.control_full = hdr->control_full.load(std::memory_order_relaxed);
    info.reaped = hdr->reaped.load(std::memory_order_relaxed);
    info.expired = hdr->expired.load(std::memory_order_relaxed);
    info.taken = hdr->taken.load(std::memory_order_acquire);
    info.next_seq = hdr->next_seq.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < hdr->max_consumers; ++i) {
        ConsumerSlot& s = slots[i];
        SlotInfo si{};
        // SYNC POINT (6) seq_cst load / acquire name loads / re-load: the name is the word's
        // only if the word did not change (else read the slot again).
        for (;;) {
            uint64_t word = s.state.load(std::memory_order_seq_cst);
            si.slot = i;
            si.state = slot_state(word);
            si.generation = slot_generation(word);
            si.durable = slot_durable(word) && si.state != SLOT_FREE;
            si.name = si.durable ? load_slot_name(s) : std::string();
            si.released = s.released.load(std::memory_order_acquire);
            si.attached_at = s.attached_at.load(std::memory_order_relaxed);
            si.pid = s.pid.load(std::memory_order_relaxed);
            if (s.state.load(std::memory_order_acquire) == word) break;
        }
        if (si.state == SLOT_FREE && si.generation == 0) continue;  // never used
        si.alive = ofd_locked_by_other(m->fd, SLOT_LOCK_OFFSET + i);
        info.consumers.push_back(si);
    }
    return info;
}

}  // namespace hsc
