#!/usr/bin/env python3
"""Fuzz the protocol v2 parsers: ``notice.decode`` and ``record.read_entry`` (+ ``row_views``).

Feeds N inputs, half notices and half ring payloads, each a mutation of a valid one (bit
flips, byte overwrites, truncation/extension/splices, structure-aware edits of the decoded
meta re-framed with a correct length, non-canonical encodings, random msgpack objects) or raw
random bytes; counts outcomes by exception type; exits 1 if any exception is outside the
``HSCaptureError`` hierarchy (printing a reproducer for the first few).

Usage: ``.venv/bin/python scripts/fuzz_protocol.py [N] [--workers W] [--seed S]``

Last full runs (N = 1,000,000, 2 workers, the 2-core dev machine, shared with other jobs):
seed 0 in 39.9 s, seed 1 in 20.7 s; 0 foreign exceptions in both. Seed 0 outcomes:
RecordFormatError 491,045, NoticeError 431,395, NoticeVersionError 45,301, accepted 31,437,
InvalidProducerIdError 822 (structure-aware "tree" edits: 8,311 of 199,531 notices and
5,964 of 225,711 payloads still valid, the rest rejected across every schema and block rule).
"""

from __future__ import annotations

import argparse
import collections
import copy
import multiprocessing
import os
import random
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402

from hscapture import notice as nt  # noqa: E402
from hscapture import record as rc  # noqa: E402
from hscapture.errors import HSCaptureError  # noqa: E402

EPOCH = 0x1234_5678_9ABC_DEF0
PRODUCER = "fuzz-p0"
INTERESTING_INTS = [0, 1, -1, 2, 7, 63, 64, 65, 127, 128, 255, 256, 4095, 4096, 65535, 65536,
                    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -2**31,
                    -2**63, EPOCH, EPOCH + 1]
INTERESTING_VALUES: list[Any] = INTERESTING_INTS + [
    True, False, None, "", "x", "x" * 600, "a\x00b", "batch", "drop", "abort", "unheard",
    "entry", "bfloat16", "residual", b"", b"\x00", b"\x01" * 3, [], {}, [0], [[0, 0]], [[64, 1]],
    [[-64, 1]], [[0, 2**62]], {"rid": "r"}, 0.5, float("inf"), float("nan"), [[]], {"": {}}]
MSGPACK_MARKERS = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3,
                   0xC4, 0xC5, 0xC6, 0xC7, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD3, 0xD9,
                   0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0, 0xFF]


# --- valid seeds --------------------------------------------------------------------------


def _batch(rows: list[dict[str, Any]], *, hidden: int, block_cols: list[int], layers: list[int],
           dtype: str = "bfloat16", seq: int = 0) -> bytes:
    plan = rc.plan_batch(producer=PRODUCER, epoch=EPOCH, seq=seq, dp_rank=1, layers=layers,
                         layer_kinds=["residual"] * (len(layers) - 1) + ["final_norm"],
                         convention="hf", model="fuzz/model", hidden=hidden, dtype=dtype,
                         rows=rows, block_cols=block_cols)
    buf = bytearray(plan.length)
    rc.write_header(memoryview(buf), plan)
    rng = np.random.default_rng(len(rows))
    for off, size in zip(plan.block_offsets, plan.block_bytes):
        buf[off:off + size] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    buf[plan.ids_offset:plan.length] = np.arange(plan.tokens, dtype="<i4").tobytes()
    return bytes(buf)


def _row(rid: str, start: int, count: int, **over: Any) -> dict[str, Any]:
    row = {"rid": rid, "token_start": start, "token_count": count, "last": False,
           "cached_prefix": 0, "extra": {}, "fields": {}}
    row.update(over)
    return row


def record_seeds() -> list[bytes]:
    rows2 = [_row("req-a", 0, 3, fields={"loss_mask": b"\x00\x01\x01"}),
             _row("req-b", 8, 1, last=True, cached_prefix=8, extra={"lang": "en", "n": [1, 2]})]
    many = [_row(f"r{i}", i * 10, 1 + i % 3) for i in range(12)]
    return [
        _batch(rows2, hidden=4, block_cols=[8], layers=[3, 7]),
        _batch(rows2, hidden=2, block_cols=[2, 2, 2], layers=[0, 1, 2], dtype="float32", seq=5),
        _batch([_row("é-日本", 0, 2)], hidden=3, block_cols=[3], layers=[31], dtype="float8_e4m3fn"),
        _batch(many, hidden=2, block_cols=[4, 2], layers=[1, 2, 3], seq=2**40),
        rc.control_payload(rc.drop_meta(PRODUCER, EPOCH, 9, 0, "ring_full", rows2)),
        rc.control_payload(rc.abort_meta(PRODUCER, EPOCH, 11, 0, "req-a", "client", True,
                                         {"attempt": 2})),
        rc.control_payload(rc.unheard_meta(PRODUCER, EPOCH, 12, 0,
                                           [{"rid": "req-a", "seq": 0, "last": False},
                                            {"rid": "x", "seq": 3, "last": True}],
                                           5, [1, 2])),
    ]


def notice_seeds(records: list[bytes]) -> list[bytes]:
    meta = records[0][4:4 + int.from_bytes(records[0][:4], "little")]
    base = {"v": 3, "producer": PRODUCER, "epoch": EPOCH}
    return [
        nt.encode(nt.entry_notice(PRODUCER, EPOCH, 0, 2, "batch", "hscapture-1-fuzz-00", 8192,
                                  len(records[0]), 4, meta)),
        nt.encode(dict(base, kind="heartbeat", pid=77, segment="seg-1", next_seq=40, head=1 << 20,
                       committed=30, dropped=9, unrecorded=1, backlog=2, recorded_through=38,
                       heard=True, errors=0, time_ns=1_700_000_000_000_000_000)),
        nt.encode(dict(base, kind="hello", pid=77, segment="seg-1", capacity=1 << 30,
                       time_ns=5)),
        nt.encode(dict(base, kind="bye", next_seq=40, time_ns=6)),
    ]


# --- mutations ----------------------------------------------------------------------------


def random_object(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.5:
        # deepcopy: the interesting lists and maps are shared constants, edited in place later
        return copy.deepcopy(rng.choice(INTERESTING_VALUES)) if rng.random() < 0.6 else rng.choice([
            rng.randrange(-2**63, 2**64), "".join(chr(rng.randrange(32, 0x3000))
                                                  for _ in range(rng.randrange(8))),
            rng.randbytes(rng.randrange(8))])
    if r < 0.75:
        return [random_object(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["v", "kind", "seq", "rows", "rid", "x", ""]): random_object(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, prefix + (i,)))
    return out


def mutate_tree(rng: random.Random, obj: Any) -> Any:
    """One structure-aware edit somewhere in a decoded msgpack tree (returns the new root)."""
    path = rng.choice(_paths(obj))
    if not path:
        return random_object(rng)
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    value = parent[key]
    op = rng.randrange(9)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
    elif op == 1 and isinstance(parent, dict):
        parent[rng.choice(["surprise", "overflow", "restart", "fields", "meta"])] = \
            random_object(rng)
    elif op == 2 and isinstance(value, int) and not isinstance(value, bool):
        new = rng.choice([value + 1, value - 1, value + 64, value - 64, value * 2, -value,
                          value + 1, value ^ (1 << rng.randrange(64)), value // 2])
        parent[key] = new if -2**63 <= new < 2**64 else value
    elif op == 3:
        parent[key] = [value]  # a scalar where a list is expected, or vice versa
    elif op == 4 and isinstance(value, list) and value:
        i = rng.randrange(len(value))
        rng.choice([lambda: value.pop(i), lambda: value.insert(i, value[i]),
                    lambda: value.reverse()])()
    elif op == 5 and isinstance(value, (str, bytes)):
        parent[key] = value[:rng.randrange(len(value) + 1)] + (
            value[:1] * rng.randrange(3) if rng.random() < 0.5 else value[:0])
    elif op == 6 and isinstance(value, int) and not isinstance(value, bool):
        parent[key] = rng.choice([str(value), float(value), bool(value & 1)])
    else:
        parent[key] = random_object(rng)
    return obj


def non_canonical(rng: random.Random, blob: bytes) -> bytes:
    """Same content, non-canonical bytes: a duplicated top-level key or a widened int."""
    if rng.random() < 0.5 and blob and 0x81 <= blob[0] <= 0x8E:
        try:
            first_key = next(iter(msgpack.unpackb(blob)))
            return (bytes([blob[0] + 1]) + blob[1:] + msgpack.packb(first_key)
                    + msgpack.packb(random_object(rng)))
        except Exception:
            return blob
    positions = [i for i, b in enumerate(blob) if b < 0x80]
    if not positions:
        return blob
    i = rng.choice(positions)
    return blob[:i] + b"\xcf" + blob[i].to_bytes(8, "big") + blob[i + 1:]


def bytes_mutation(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    buf = bytearray(data)
    op = rng.randrange(5)
    if op == 0 and buf:
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return "bitflip", bytes(buf)
    if op == 1 and buf:
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.choice(MSGPACK_MARKERS)
        return "byteset", bytes(buf)
    if op == 2:
        return "truncate", bytes(buf[:rng.randrange(len(buf) + 1)])
    if op == 3:
        return "extend", bytes(buf) + rng.randbytes(rng.randrange(1, 80))
    if buf:
        i, j = sorted(rng.randrange(len(buf) + 1) for _ in range(2))
        chunk = bytes(buf[i:j])
        k = rng.randrange(len(buf) + 1)
        return "splice", bytes(buf[:i] + buf[j:k] + chunk + buf[k:]) if k >= j else bytes(
            buf[:k] + chunk + buf[k:])
    return "random", rng.randbytes(rng.randrange(64))


def mutate_notice(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes]:
    seed = rng.choice(seeds)
    r = rng.random()
    if r < 0.05:
        return "random", rng.randbytes(rng.randrange(300))
    if r < 0.10:
        return "random_obj", msgpack.packb(random_object(rng), use_bin_type=True)
    if r < 0.50:
        return bytes_mutation(rng, seed)
    if r < 0.60:
        return "noncanonical", non_canonical(rng, seed)
    obj = msgpack.unpackb(seed)
    for _ in range(rng.randint(1, 3)):
        obj = mutate_tree(rng, obj)
    try:
        return "tree", msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):  # an int msgpack cannot hold
        return "tree", seed


def mutate_record(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes, int]:
    """A mutated payload and the payload_len to claim for it."""
    seed = rng.choice(seeds)
    r = rng.random()
    if r < 0.05:
        data = rng.randbytes(rng.randrange(1200))
        return "random", data, len(data)
    if r < 0.40:
        name, data = bytes_mutation(rng, seed)
        plen = len(data) if rng.random() < 0.9 else rng.randrange(len(data) + 1)
        return name, data, plen
    meta_len = int.from_bytes(seed[:4], "little")
    blob, rest = seed[4:4 + meta_len], seed[4 + meta_len:]
    if r < 0.50:
        name, new = "noncanonical", non_canonical(rng, blob)
    else:
        obj = msgpack.unpackb(blob)
        for _ in range(rng.randint(1, 3)):
            obj = mutate_tree(rng, obj)
        name = "tree"
        if r < 0.55:
            obj = random_object(rng)
            name = "random_obj"
        try:
            new = msgpack.packb(obj, use_bin_type=True)
        except (OverflowError, ValueError, TypeError):
            new = blob
    data = len(new).to_bytes(4, "little") + new + rest
    # follow the meta's own length when it names one, to reach the block rules
    if name == "tree" and isinstance(obj, dict) and type(obj.get("length")) is int \
            and 0 <= obj["length"] <= 1 << 16 and rng.random() < 0.7:
        data = data[:obj["length"]].ljust(obj["length"], b"\0")
    return name, data, len(data)


# --- targets ------------------------------------------------------------------------------


def check_notice(frame: bytes) -> None:
    nt.decode(frame)


def check_record(payload: bytes, payload_len: int, rng: random.Random) -> None:
    tag = None if rng.random() < 0.8 else rng.choice([0, 1, nt.rid_tag("req-a")])
    producer = PRODUCER if rng.random() < 0.7 else None
    epoch = EPOCH if rng.random() < 0.95 else EPOCH + 1
    e = rc.read_entry(payload, payload_len=payload_len, epoch=epoch, producer=producer, tag=tag)
    if e.kind == "batch":
        with np.errstate(all="ignore"):  # random float bits: NaN/inf sums are fine
            for view in e.row_views(payload):
                for i in range(view.n_layers):
                    view.layer(i).sum()
                view.token_ids.sum()


def run(n: int, seed: int) -> dict[str, Any]:
    """Fuzz ``n`` inputs with ``seed``; returns counters and reproducers of foreign errors."""
    rng = random.Random(seed)
    records = record_seeds()
    notices = notice_seeds(records)
    outcomes: collections.Counter[tuple[str, str, str]] = collections.Counter()
    foreign: list[str] = []
    for i in range(n):
        if i % 2 == 0:
            strategy, data = mutate_notice(rng, notices)
            target, call = "notice", (lambda d=data: check_notice(d))
        else:
            strategy, data, plen = mutate_record(rng, records)
            target, call = "record", (lambda d=data, p=plen: check_record(d, p, rng))
        try:
            call()
            result = "ok"
        except HSCaptureError as exc:
            result = type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - this is what the fuzzer hunts
            result = "FOREIGN " + type(exc).__name__
            if len(foreign) < 5:
                foreign.append(f"{target} {strategy} {data.hex()}\n{traceback.format_exc()}")
        outcomes[(target, strategy, result)] += 1
    return {"outcomes": outcomes, "foreign": foreign}


def _worker(args: tuple[int, int]) -> dict[str, Any]:
    return run(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=1_000_000, help="inputs (default 1e6)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    per = [args.n // args.workers + (i < args.n % args.workers) for i in range(args.workers)]
    jobs = [(k, args.seed * 1000 + i) for i, k in enumerate(per)]
    if args.workers == 1:
        results = [_worker(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            results = pool.map(_worker, jobs)
    elapsed = time.monotonic() - t0
    outcomes: collections.Counter[tuple[str, str, str]] = collections.Counter()
    foreign: list[str] = []
    for res in results:
        outcomes.update(res["outcomes"])
        foreign.extend(res["foreign"])
    by_type: collections.Counter[str] = collections.Counter()
    for (_, _, result), count in outcomes.items():
        by_type[result] += count
    n_foreign = sum(c for r, c in by_type.items() if r.startswith("FOREIGN"))
    print(f"fuzz_protocol: {args.n} inputs in {elapsed:.1f} s ({args.workers} workers, "
          f"seed {args.seed}, {args.n / max(elapsed, 1e-9) / 1000:.1f}k inputs/s)")
    print("outcomes by type:")
    for result, count in by_type.most_common():
        print(f"  {result:28s} {count:9d}")
    print("outcomes by target/strategy (accepted / rejected):")
    keys = sorted({(t, s) for t, s, _ in outcomes})
    for t, s in keys:
        ok = outcomes[(t, s, "ok")]
        total = sum(c for (tt, ss, _), c in outcomes.items() if (tt, ss) == (t, s))
        print(f"  {t:6s} {s:13s} {ok:8d} / {total - ok:8d}")
    print(f"foreign exceptions: {n_foreign}")
    for text in foreign[:5]:
        print("---\n" + text)
    return 1 if n_foreign else 0


if __name__ == "__main__":
    sys.exit(main())
