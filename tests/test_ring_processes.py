"""The ring across real processes (multiprocessing 'spawn', real /dev/shm segments)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import time
import zlib

import numpy as np
import pytest

from hscapture import _ring
from hscapture.ring import cleanup_stale

CTX = mp.get_context("spawn")
SEQ = struct.Struct("<Q")


# --- child process bodies (module level: 'spawn' imports them) -----------------------------------

def _record_size(rng: np.random.Generator, n: int) -> np.ndarray:
    """Mostly small, some medium, a few of several MB."""
    kind = rng.random(n)
    small = rng.integers(0, 257, n)
    medium = rng.integers(257, 64 * 1024, n)
    large = rng.integers(64 * 1024, 4 * 1024 * 1024, n)
    return np.where(kind < 0.95, small, np.where(kind < 0.9995, medium, large))


def _producer_main(name, capacity, count, seed, ready, go, out, whole=False):
    p = _ring.Producer(name, capacity, 4)
    ready.set()
    go.wait(30)
    rng = np.random.default_rng(seed)
    sizes = _record_size(rng, count)
    src = rng.integers(0, 256, 8 * 1024 * 1024, dtype=np.uint8).tobytes()
    srcv = memoryview(src)
    full = 0
    t0 = time.perf_counter()
    for seq in range(count):
        n = int(sizes[seq])
        sb = SEQ.pack(seq)
        if n < 8:
            body = sb[:n]
            crc = zlib.crc32(body)
        else:
            off = (seq * 4099) % (len(src) - n + 8)
            body = srcv[off:off + n - 8]
            crc = zlib.crc32(body, zlib.crc32(sb))
        tag = (crc << 32) | (seq & 0xFFFFFFFF)
        if whole:   # put(): placed, copied and committed in one call
            data = bytes(body) if n < 8 else sb + bytes(body)
            while p.put(data, tag) < 0:
                full += 1
                os.sched_yield()
            continue
        while True:
            pos = p.reserve(n, tag)
            if pos >= 0:
                break
            full += 1
            os.sched_yield()
        if n:
            buf = p.payload(pos)
            if n < 8:
                buf[:] = body
            else:
                buf[:8] = sb
                buf[8:] = body
        p.commit(pos)
    out.put(("producer", count, full, time.perf_counter() - t0))
    go.wait(60)  # keep the segment (and the producer lock) until the consumers are done
    p.close()


def _consumer_main(name, count, ready, out, take=False):
    c = _ring.Consumer(name)
    ready.set()
    errors = []
    expected = 0
    nbytes = 0
    copy = bytearray(8 << 20)
    while expected < count:
        if take:   # take_into(): polled, copied out and released in one call
            got = c.take_into(copy)
            if got is None:
                os.sched_yield()
                continue
            n, seq, tag = got
            payload = memoryview(copy)[:n]
        else:
            rec = c.poll()
            if rec is None:
                os.sched_yield()
                continue
            payload, n, seq, tag = rec.payload, rec.payload_len, rec.seq, rec.tag
        crc = zlib.crc32(payload)
        if seq != expected or (tag & 0xFFFFFFFF) != (expected & 0xFFFFFFFF):
            errors.append(f"order: expected seq {expected}, found {seq} (tag {tag:#x})")
            expected = seq
        elif (tag >> 32) != crc:
            errors.append(f"torn/corrupt payload at seq {expected}")
        elif n >= 8 and SEQ.unpack_from(payload)[0] != expected:
            errors.append(f"payload seq mismatch at {expected}")
        del payload
        if not take:
            c.release(rec.end)
        nbytes += n
        expected += 1
        if len(errors) > 20:
            break
    extra = c.poll()
    out.put(("consumer", expected, errors, nbytes, extra is not None))
    c.close()


def test_one_million_records_two_consumer_processes_none_lost_duplicated_torn_or_reordered(ring_name):
    count = 1_000_000
    out = CTX.Queue()
    p_ready, go = CTX.Event(), CTX.Event()
    prod = CTX.Process(target=_producer_main, args=(ring_name, 32 << 20, count, 1234, p_ready, go, out))
    prod.start()
    assert p_ready.wait(30)
    readies = [CTX.Event() for _ in range(2)]
    cons = [CTX.Process(target=_consumer_main, args=(ring_name, count, r, out)) for r in readies]
    for c in cons:
        c.start()
    for r in readies:
        assert r.wait(30)
    t0 = time.perf_counter()
    go.set()
    results = [out.get(timeout=120) for _ in range(3)]
    elapsed = time.perf_counter() - t0
    for proc in [prod, *cons]:
        proc.join(30)
        assert proc.exitcode == 0
    consumers = [r for r in results if r[0] == "consumer"]
    assert len(consumers) == 2
    for _, n, errors, nbytes, extra in consumers:
        assert errors == []
        assert n == count
        assert not extra  # nothing after the last record: no duplicates
    print(f"\n1M records, {consumers[0][3] / 1e9:.2f} GB per consumer, {elapsed:.1f} s")
    assert elapsed < 60


def test_records_put_whole_reach_a_polling_and_a_copying_consumer_process_none_lost_duplicated_torn_or_reordered(
        ring_name):
    """Producer.put() publishes a record already committed (one store of the head), and
    Consumer.take_into() copies it out and releases it in one call: across processes, a small
    ring (many laps), every record arrives once, in order, with the bytes it was put with."""
    count = 200_000
    out = CTX.Queue()
    p_ready, go = CTX.Event(), CTX.Event()
    prod = CTX.Process(target=_producer_main,
                       args=(ring_name, 8 << 20, count, 99, p_ready, go, out, True))
    prod.start()
    assert p_ready.wait(30)
    readies = [CTX.Event() for _ in range(2)]
    cons = [CTX.Process(target=_consumer_main, args=(ring_name, count, r, out, take))
            for r, take in zip(readies, (False, True))]
    for c in cons:
        c.start()
    for r in readies:
        assert r.wait(30)
    go.set()
    results = [out.get(timeout=120) for _ in range(3)]
    for proc in [prod, *cons]:
        proc.join(30)
        assert proc.exitcode == 0
    consumers = [r for r in results if r[0] == "consumer"]
    producer = [r for r in results if r[0] == "producer"][0]
    assert len(consumers) == 2
    for _, n, errors, nbytes, extra in consumers:
        assert errors == []
        assert n == count and not extra
    assert consumers[0][3] == consumers[1][3] > 0
    assert producer[2] > 0, "the ring never filled: the laps were not exercised"


# --- partial writes --------------------------------------------------------------------------

def test_reader_never_sees_a_record_part_way_through_writing(ring_name):
    p = _ring.Producer(ring_name, 1 << 20)
    c = _ring.Consumer(ring_name)
    pos = p.reserve(4096, tag=9)
    view = p.payload(pos)
    view[:2048] = b"\x01" * 2048
    assert c.head > c.position  # the reservation is visible...
    for _ in range(3):
        assert c.poll() is None  # ...but not readable until committed
    view[2048:] = b"\x01" * 2048
    p.commit(pos)
    rec = c.poll()
    assert rec.position == pos and rec.tag == 9
    assert bytes(rec.payload) == b"\x01" * 4096
    c.close()
    p.close()


def _slow_writer_main(name, size, rounds, ready, go, out, read):
    p = _ring.Producer(name, 64 << 20)
    ready.set()
    go.wait(30)
    for i in range(rounds):
        while (pos := p.reserve(size)) < 0:
            os.sched_yield()
        arr = np.frombuffer(p.payload(pos), dtype=np.uint8)
        fill = (i % 250) + 1
        for k in range(0, size, 65536):  # slowly, chunk by chunk
            arr[k:k + 65536] = fill
        p.commit(pos)
    out.put("done")
    read.wait(60)           # the segment stays up until the reader has read every record
    p.close()


def test_reader_in_another_process_never_sees_a_partly_written_record(ring_name):
    out, ready, go, read = CTX.Queue(), CTX.Event(), CTX.Event(), CTX.Event()
    size, rounds = 4 << 20, 100
    w = CTX.Process(target=_slow_writer_main, args=(ring_name, size, rounds, ready, go, out,
                                                    read))
    w.start()
    assert ready.wait(30)
    c = _ring.Consumer(ring_name)
    go.set()
    got = 0
    deadline = time.monotonic() + 60
    while got < rounds and time.monotonic() < deadline:
        rec = c.poll()
        if rec is None:
            continue
        arr = np.frombuffer(rec.payload, dtype=np.uint8)
        fill = arr[0]
        assert fill != 0 and (arr == fill).all(), f"record {rec.seq} seen part-way through writing"
        c.release(rec.end)
        got += 1
    read.set()
    assert got == rounds
    c.close()
    w.join(30)


# --- dead consumers --------------------------------------------------------------------------

def _stuck_reader_main(name, reading):
    c = _ring.Consumer(name)
    while (rec := c.poll()) is None:
        time.sleep(0.001)
    view = rec.payload  # mid-read: holds the record, never releases  # noqa: F841
    reading.set()
    time.sleep(600)


def test_consumer_killed_mid_read_unblocks_producer_and_other_consumer_continues(ring_name):
    cap = 64 * 1024
    p = _ring.Producer(ring_name, cap, 4)
    reading = CTX.Event()
    victim = CTX.Process(target=_stuck_reader_main, args=(ring_name, reading))
    victim.start()
    while p.stats()["live_consumers"] < 1:
        time.sleep(0.01)
    survivor = _ring.Consumer(ring_name)
    expected = 0

    def drain():
        nonlocal expected
        while (rec := survivor.poll()) is not None:
            assert rec.seq == expected and SEQ.unpack_from(rec.payload)[0] == expected
            expected += 1
            survivor.release(rec.end)

    seq = 0
    while True:  # fill the ring until the stuck consumer blocks the producer
        pos = p.reserve(1000)
        if pos < 0:
            break
        p.payload(pos)[:8] = SEQ.pack(seq)
        p.commit(pos)
        seq += 1
        drain()
        if seq == 1:
            assert reading.wait(30)
    assert p.reserve(1000) == -1
    assert p.stats()["live_consumers"] == 2

    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    while (pos := p.reserve(1000)) < 0:
        assert time.monotonic() - t0 < 2.0, "producer still blocked 2 s after the consumer died"
        time.sleep(0.0005)
    unblocked = time.monotonic() - t0
    p.payload(pos)[:8] = SEQ.pack(seq)
    p.commit(pos)
    seq += 1
    victim.join(10)
    stats = p.stats()
    assert stats["reaped"] == 1 and stats["live_consumers"] == 1
    for _ in range(500):  # keeps flowing, in order, for the survivor
        while (pos := p.reserve(1000)) < 0:
            drain()
        p.payload(pos)[:8] = SEQ.pack(seq)
        p.commit(pos)
        seq += 1
        drain()
    drain()
    assert expected == seq
    print(f"\nproducer unblocked {unblocked * 1e3:.2f} ms after SIGKILL (incl. process exit)")
    survivor.close()
    p.close()


def test_reap_frees_the_slot_of_a_dead_consumer_and_a_new_consumer_can_take_it(ring_name):
    p = _ring.Producer(ring_name, 4096, max_consumers=1)
    reading = CTX.Event()
    victim = CTX.Process(target=_stuck_reader_main, args=(ring_name, reading))
    victim.start()
    while p.stats()["live_consumers"] < 1:
        time.sleep(0.01)
    p.commit(p.reserve(1))
    assert reading.wait(30)
    assert p.reap() == 0
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    assert p.reap() == 1
    c = _ring.Consumer(ring_name)  # the only slot is free again
    assert c.slot == 0
    assert p.reap() == 0  # the new consumer is live: its generation protects it
    info = _ring.segment_info(ring_name)
    assert info["consumers"][0]["alive"] and info["consumers"][0]["generation"] == 3
    c.close()
    p.close()


# --- stale producers -------------------------------------------------------------------------

def _idle_producer_main(name, ready):
    p = _ring.Producer(name, 4096)  # noqa: F841  (held until SIGKILL)
    ready.set()
    time.sleep(600)


def test_stale_segment_of_a_killed_producer_is_detected_and_cleaned(ring_name):
    prefix = ring_name + "-"
    dead_name, live_name = prefix + "dead", prefix + "live"
    ready = CTX.Event()
    proc = CTX.Process(target=_idle_producer_main, args=(dead_name, ready))
    proc.start()
    assert ready.wait(30)
    live = _ring.Producer(live_name, 4096)
    c = _ring.Consumer(dead_name)
    assert not _ring.is_stale(dead_name) and c.producer_alive()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert _ring.is_stale(dead_name)
    assert not c.producer_alive()
    info = _ring.segment_info(dead_name)
    assert info["producer_alive"] is False and info["producer_pid"] == proc.pid
    assert not _ring.is_stale(live_name)
    assert cleanup_stale(prefix) == [(dead_name, "removed", "no live producer")]
    assert not os.path.exists("/dev/shm/" + dead_name)
    assert os.path.exists("/dev/shm/" + live_name)
    c.close()
    live.close()
    assert not os.path.exists("/dev/shm/" + live_name)
