"""The transformers adapter (hscapture/adapters/transformers.py): what a forward becomes.

A forward inside ``HiddenStateCapture.request`` is published as an engine adapter publishes a
pass: one ring entry per chunk index for every row whose real tokens are one span (right or
left padding), straight from the layer outputs; rows with holes in their mask, and rows of a
rid that appears twice, go one by one. Every sample arrives bit-exact against transformers'
own ``output_hidden_states``, with its token ids and its per-token fields.
"""

from __future__ import annotations

import torch

from hscapture import Producer, Subscriber
from hscapture.adapters.transformers import HiddenStateCapture
from hscapture.demo import tiny_llama

AUX = [0, 1]      # (the last layer's pre-norm output is not among transformers' hidden_states)


def _run(endpoint, ids, mask, rids, chunk_size, fields=None):
    """Capture one forward; returns (samples by rid, the reference states, entries written)."""
    model = tiny_llama(seed=3, dtype=torch.float32, layers=3, hidden=64)
    calls = []
    with Producer(endpoint, producer_id="adapter", capacity=16 << 20, full_policy="wait",
                  wait_timeout_s=30) as p, Subscriber(endpoint) as sub:
        sub.wait_ready(timeout=20)
        real = p.capture_batch

        def counted(rows, *a, **kw):        # the real method, its calls counted
            calls.append([(r.rid, r.token_start, r.token_count) for r in rows])
            return real(rows, *a, **kw)
        p.capture_batch = counted
        cap = HiddenStateCapture(model, p, AUX)
        with torch.no_grad():
            with cap.request(rids, ids, mask, chunk_size=chunk_size, fields=fields):
                hs = model(ids, attention_mask=mask, output_hidden_states=True)
        p.flush()
        got = {}
        for rid in {r for r in rids if r is not None and mask[rids.index(r)].any()}:
            got[rid] = sub.get(rid, timeout=30)
        assert sub.poll(timeout=0.2) is None, "a sample nobody asked for arrived"
        assert not sub.stats()["dropped"] and not sub.stats()["incomplete"]
    return got, hs, calls


def _expect_exact(got, hs, ids, mask, rids, fields=None):
    n = len(hs.hidden_states) - 1
    for b, rid in enumerate(rids):
        if rid is None or not mask[b].any():
            continue
        idx = mask[b].nonzero().flatten()
        s = got[rid]
        assert torch.equal(s.token_ids.to(torch.int64), ids[b, idx]), rid
        for L in AUX:
            assert torch.equal(s.tensors[f"layer_{L}"], hs.hidden_states[L + 1][b, idx]), (rid, L)
        assert torch.equal(s.tensors["final_norm"], hs.hidden_states[n][b, idx]), rid
        if fields is not None and fields[b] is not None:
            want = torch.tensor(fields[b]["loss_mask"], dtype=torch.uint8)
            assert torch.equal(s.fields["loss_mask"], want), rid


def test_a_padded_forward_is_one_entry_per_chunk_index_and_every_row_arrives_exact(endpoint):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 4096, (5, 40), generator=g)
    mask = torch.zeros(5, 40, dtype=torch.long)
    mask[0, :40] = 1          # whole row: 3 chunks of 16
    mask[1, :9] = 1           # right padding: 1 chunk
    mask[2, 13:] = 1          # left padding: 27 tokens, 2 chunks
    mask[3, :33] = 1          # not requested (rid None)
    # row 4: all padding, nothing to capture
    rids = ["a", "b", "c", None, "e"]
    fields = [{"loss_mask": [i % 2 for i in range(40)]}, {"loss_mask": [1] * 9},
              {"loss_mask": [0] * 20 + [1] * 7}, None, None]
    got, hs, calls = _run(endpoint, ids, mask, rids, 16, fields)
    _expect_exact(got, hs, ids, mask, rids, fields)
    # chunk index k of every row long enough, in one entry: 3 entries, not 6 (one per chunk)
    assert calls == [[("a", 0, 16), ("b", 0, 9), ("c", 0, 16)],
                     [("a", 16, 16), ("c", 16, 11)],
                     [("a", 32, 8)]]


def test_rows_with_holes_in_their_mask_go_one_by_one_and_arrive_exact(
        endpoint):
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 4096, (3, 24), generator=g)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 5:9] = 0          # a hole: its states gathered on the device, captured alone
    got, hs, calls = _run(endpoint, ids, mask, ["x", "y", "z"], None)
    _expect_exact(got, hs, ids, mask, ["x", "y", "z"])
    assert calls[0] == [("x", 0, 24), ("z", 0, 24)] and calls[1:] == [[("y", 0, 20)]]
