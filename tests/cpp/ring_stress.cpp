// Ring stress test, built for ThreadSanitizer by scripts/tsan.sh (and tests/test_ring_tsan.py).
//
// One process, one real /dev/shm segment, three threads:
//   producer  random record sizes (mostly small, some tens of KB, a few >100 KB), payload bytes
//             derived from (seed, seq), tag = FNV-1a of the payload; some records are control
//             reservations (control_reserve is set), some are aborted.
//   durable   a durable subscription "stress-b" that reads every record and, at random points,
//             detaches (sometimes holding a record it read but did not release) and resumes
//             with resume_only: it must see EVERY non-aborted record exactly once, in order,
//             from its released position on, with a good checksum.
//   churn     an anonymous consumer that re-registers at random points: within one
//             registration it must see contiguous records from attached_at on, checksums good.
//
// Why one process: TSan tracks memory by virtual address, so the build defines
// HSC_SHARE_MAPPINGS_IN_PROCESS and consumers reuse the producer's mapping (the data region is
// then not mprotect'ed read-only). Cross-process behaviour is covered by the Python tests.
//
// Usage: ring_stress [records=200000] [seed=1]. Exit 0 = every check passed.
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "hscapture/ring.h"

namespace {

constexpr uint64_t CAPACITY = 1 << 20;
constexpr uint64_t CONTROL_RESERVE = 16 << 10;
constexpr int MAX_ERRORS = 20;

uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct Plan {
    uint64_t seed, records;
    uint64_t size(uint64_t seq) const {
        uint64_t h = splitmix(seed * 1000003 + seq);
        uint64_t r = h % 1000, v = h >> 20;
        if (r < 900) return v % 513;
        if (r < 995) return v % (24 << 10);
        return v % (160 << 10);
    }
    bool aborted(uint64_t seq) const { return seq + 1 < records && splitmix(seed ^ (seq << 7)) % 53 == 0; }
    bool control(uint64_t seq) const { return seq % 11 == 0; }
    void fill(uint64_t seq, uint8_t* p, uint64_t n) const {
        uint64_t s = splitmix(seed + (seq << 1));
        for (uint64_t i = 0; i < n; i += 8) {
            s = splitmix(s);
            uint64_t chunk = i == 0 ? seq : s;  // the first 8 bytes carry the sequence number
            std::memcpy(p + i, &chunk, std::min<uint64_t>(8, n - i));
        }
    }
    // the next sequence number a reader expects after `seq`
    uint64_t next(uint64_t seq) const {
        do ++seq;
        while (seq < records && aborted(seq));
        return seq;
    }
    uint64_t first() const { return aborted(0) ? next(0) : 0; }
};

uint64_t fnv1a(const uint8_t* p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

struct Errors {
    std::atomic<int> count{0};
    void add(const char* who, const std::string& what) {
        if (count.fetch_add(1) < MAX_ERRORS) std::fprintf(stderr, "[%s] %s\n", who, what.c_str());
    }
};

// Checks one record against the plan. Returns false (and records the error) if it is wrong.
bool check(const Plan& plan, const hsc::RecordView& r, uint64_t want_seq, Errors& err, const char* who) {
    char buf[256];
    if (r.seq != want_seq) {
        std::snprintf(buf, sizeof buf, "expected seq %" PRIu64 ", found %" PRIu64 " at position %" PRIu64, want_seq,
                      r.seq, r.position);
        err.add(who, buf);
        return false;
    }
    if (r.payload_len != plan.size(r.seq) || fnv1a(r.payload, r.payload_len) != r.tag) {
        std::snprintf(buf, sizeof buf, "seq %" PRIu64 ": payload_len %" PRIu64 " (expected %" PRIu64 ") or checksum bad",
                      r.seq, r.payload_len, plan.size(r.seq));
        err.add(who, buf);
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Plan plan{argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1, argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000};
    if (plan.records < 2) plan.records = 2;
    const std::string name = "hsctest-stress-" + std::to_string(getpid()) + "-" + std::to_string(plan.seed);
    Errors err;
    std::atomic<bool> producer_done{false};
    std::atomic<uint64_t> resumes{0}, redelivered{0}, registrations{0}, full_spins{0};
    try {
        hsc::Producer producer(name, CAPACITY, 4, 0, CONTROL_RESERVE);
        // Both readers exist before the first record, so the durable one must see all of them.
        auto durable = std::make_unique<hsc::Consumer>(name, producer.epoch(), "stress-b");
        auto churn = std::make_unique<hsc::Consumer>(name, producer.epoch(), "");

        // A failure in any thread stops all three (an exception becomes an error, not terminate).
        auto guarded = [&](const char* who, auto body) {
            return [&err, who, body]() mutable {
                try {
                    body();
                } catch (const std::exception& e) {
                    err.add(who, std::string("exception: ") + e.what());
                }
            };
        };

        std::thread prod(guarded("producer", [&] {
            std::vector<uint8_t> buf(CAPACITY);
            for (uint64_t seq = 0; seq < plan.records && err.count.load() == 0; ++seq) {
                const uint64_t n = plan.size(seq);
                plan.fill(seq, buf.data(), n);
                int64_t pos;
                // every third committed record goes through put() (copied and published whole)
                const bool whole = !plan.aborted(seq) && seq % 3 == 1;
                while ((pos = whole ? producer.put(buf.data(), n, fnv1a(buf.data(), n), plan.control(seq))
                                    : producer.reserve(n, fnv1a(buf.data(), n), plan.control(seq))) < 0) {
                    if (pos == hsc::RESERVE_TOO_LARGE) {
                        err.add("producer", "record too large");
                        return;
                    }
                    if (err.count.load() != 0) return;
                    full_spins.fetch_add(1, std::memory_order_relaxed);
                    std::this_thread::yield();
                }
                if (whole) continue;
                uint64_t len = 0;
                std::memcpy(producer.payload(uint64_t(pos), &len), buf.data(), n);
                if (plan.aborted(seq))
                    producer.abort(uint64_t(pos));
                else
                    producer.commit(uint64_t(pos));
            }
            producer_done.store(true);
        }));

        std::thread dur(guarded("durable", [&] {
            uint64_t rng = splitmix(plan.seed ^ 0xd00d);
            uint64_t want = plan.first();
            uint64_t until_detach = 1 + splitmix(rng) % 300;
            const uint64_t attached_at = durable->attached_at();
            if (attached_at != 0) err.add("durable", "attached_at " + std::to_string(attached_at) + ", expected 0");
            while (want < plan.records && err.count.load() == 0) {
                hsc::RecordView r;
                if (durable->poll(&r) == hsc::PollStatus::Empty) {
                    std::this_thread::yield();
                    continue;
                }
                if (!check(plan, r, want, err, "durable")) return;
                rng = splitmix(rng);
                const bool hold = --until_detach == 0 && rng % 3 == 0;  // detach holding this one
                if (!hold) {
                    durable->release(r.end);
                    want = plan.next(want);
                }
                if (until_detach == 0) {
                    const uint64_t released = durable->released();
                    durable->close();  // detach: the slot keeps our place
                    durable = std::make_unique<hsc::Consumer>(name, 0, "stress-b", true);
                    resumes.fetch_add(1);
                    if (hold) redelivered.fetch_add(1);
                    if (!durable->resumed() || durable->expired() || durable->position() != released ||
                        durable->attached_at() != attached_at)
                        err.add("durable", "resume at " + std::to_string(durable->position()) + " (released " +
                                               std::to_string(released) + "), resumed " +
                                               std::to_string(durable->resumed()) + ", expired " +
                                               std::to_string(durable->expired()));
                    until_detach = 1 + splitmix(rng) % 300;
                }
            }
            durable->unsubscribe();
        }));

        std::thread chn(guarded("churn", [&] {
            uint64_t rng = splitmix(plan.seed ^ 0xc4a1);
            uint64_t want = UINT64_MAX;  // unknown until the first record of a registration
            uint64_t until_reregister = 1 + splitmix(rng) % 2000;
            std::vector<uint8_t> copy(CAPACITY);
            for (;;) {
                if (err.count.load() != 0) break;
                hsc::RecordView r;
                // every other turn take() copies the record out (a too-small buffer first, now
                // and then: the record must stay the next one)
                rng = splitmix(rng);
                hsc::PollStatus st;
                if (rng % 2 == 0) {
                    st = churn->poll(&r);
                } else {
                    st = hsc::PollStatus::TooSmall;
                    if (rng % 7 == 1) {  // into 0 bytes: only an empty record is taken
                        st = churn->take(copy.data(), 0, &r);
                        if (st == hsc::PollStatus::Record && r.payload_len != 0)
                            err.add("churn", "take() into 0 bytes returned a record of " +
                                                 std::to_string(r.payload_len));
                    }
                    if (st == hsc::PollStatus::TooSmall) st = churn->take(copy.data(), copy.size(), &r);
                    r.payload = copy.data();
                }
                if (st == hsc::PollStatus::TooSmall) err.add("churn", "take() too small for the ring capacity");
                if (st == hsc::PollStatus::Empty) {
                    if (producer_done.load() && churn->position() >= churn->head()) break;
                    std::this_thread::yield();
                    continue;
                }
                if (want == UINT64_MAX) {
                    if (r.position < churn->attached_at()) err.add("churn", "record before attached_at");
                    want = r.seq;
                }
                if (!check(plan, r, want, err, "churn")) break;
                churn->release(r.end);
                want = plan.next(want);
                if (want >= plan.records) break;
                if (--until_reregister == 0) {
                    churn->close();  // anonymous: frees the slot
                    churn = std::make_unique<hsc::Consumer>(name, 0, "");
                    registrations.fetch_add(1);
                    want = UINT64_MAX;
                    rng = splitmix(rng);
                    until_reregister = 1 + rng % 2000;
                }
            }
            churn->close();
        }));

        prod.join();
        dur.join();
        chn.join();
        hsc::ProducerStats s = producer.stats();
        std::printf("ring_stress: %" PRIu64 " records (seed %" PRIu64 "), committed %" PRIu64 ", aborted %" PRIu64
                    ", full %" PRIu64 " (control %" PRIu64 "), durable resumes %" PRIu64 " (%" PRIu64
                    " with a record redelivered), anonymous re-registrations %" PRIu64 ", head %" PRIu64
                    " (%.1f laps)\n",
                    plan.records, plan.seed, s.committed, s.aborted, s.full_count, s.control_full, resumes.load(),
                    redelivered.load(), registrations.load(), s.head, double(s.head) / double(CAPACITY));
        if (s.committed + s.aborted != plan.records && err.count.load() == 0)
            err.add("main", "committed + aborted != records");
        producer.close(true);
    } catch (const std::exception& e) {  // the Producer's destructor has unlinked the segment
        err.add("main", std::string("exception: ") + e.what());
    }
    if (err.count.load() != 0) {
        std::fprintf(stderr, "ring_stress: FAILED with %d error(s)\n", err.count.load());
        return 1;
    }
    std::printf("ring_stress: OK\n");
    return 0;
}
