"""Offline check of d1/d2 run dirs (hunt h15), focused on 'ended' lines of reports.jsonl.
usage: python check_drain.py DIR...
Per dir prints: silent rids, rids over-named (jsonl non-ended lines > failed attempts),
rids printed by more drains than failed attempts, duplicate events, ended lines without an
earlier failure line of the rid, ended lines printed as failures, under-named rids
(informational: fewer failure lines than failed attempts)."""
import json, sys, collections, glob, os

def lines_of(p):
    out = []
    if os.path.exists(p):
        for l in open(p).read().split("\n")[:-1]:
            try: out.append(json.loads(l))
            except ValueError: pass
    return out

tot = collections.Counter()
for d in sys.argv[1:]:
    try:
        ev = json.load(open(d + "/producer_events.json"))
    except Exception:
        continue
    cap = [e for e in ev if e["event"] == "captured"]
    if not cap: continue
    att = cap[0]["attempts"]
    failed = {r: sum(1 for x in a if x != [True, False]) for r, a in att.items()}
    L = lines_of(d + "/out/reports.jsonl")
    idx = lines_of(d + "/out/index.jsonl")
    written = collections.Counter(x.get("rid") for x in idx if "rid" in x)
    fl = collections.Counter(); endc = collections.Counter(); evc = collections.Counter()
    seen_fail = set(); ended_wo = []; evkind = {}
    for x in L:
        if "rid" not in x: continue
        if x.get("event"): evc[x["event"]] += 1; evkind.setdefault(x["event"], set()).add(x["kind"])
        if x["kind"] == "ended":
            endc[x["rid"]] += 1
            if x["rid"] not in seen_fail: ended_wo.append(x["rid"])
        else:
            fl[x["rid"]] += 1; seen_fail.add(x["rid"])
    dup_ev = [(e, c, sorted(evkind[e])) for e, c in evc.items() if c > 1]
    # printed reports
    reps = []
    for f in sorted(glob.glob(d + "/drain*.json")) + [d + "/final.json"]:
        try: j = json.load(open(f))
        except Exception: continue
        reps.append((os.path.basename(f), j.get("rc"), j.get("rep") or {}))
    printed = collections.Counter(); printed_reason = collections.defaultdict(list)
    for name, rc, rep in reps:
        ks = set()
        for k in ("dropped", "incomplete", "rejected"):   # (in_flight: a SIGTERMed drain's unfinished samples, not failures)
            for rid, why in (rep.get(k) or {}).items():
                ks.add(rid); printed_reason[rid].append((name, k, str(why)[:80]))
        for rid in ks: printed[rid] += 1
    named = set(fl) | set(printed)
    silent = sorted(r for r, a in att.items() if a[-1] == [True, False] and not written[r] and r not in named)
    silent_any = sorted(r for r in att if not written[r] and r not in named)
    over = sorted((r, fl[r], failed.get(r, 0)) for r in fl if fl[r] > failed.get(r, 0))
    over_printed = sorted((r, printed[r], failed.get(r, 0)) for r in printed if printed[r] > failed.get(r, 0))
    under = sorted(r for r in failed if failed[r] and fl[r] < failed[r] and not written[r])
    # ended printed as a failure: rid printed incomplete 'aborted by producer' but its jsonl has
    # no non-ended line with an aborted reason
    ab_lines = collections.Counter(x["rid"] for x in L if "rid" in x and x["kind"] != "ended"
                                   and str(x.get("reason", "")).startswith("aborted by producer"))
    ended_printed = sorted(r for r in endc if any(k == "incomplete" and w.startswith("aborted by producer")
                                                  for _, k, w in printed_reason[r]) and not ab_lines[r])
    dups_written = sorted(r for r, c in written.items() if c > 1)
    res = {"dir": d, "written": len(written), "jsonl_fail_lines": sum(fl.values()), "ended_lines": sum(endc.values()),
           "silent_final_ok": silent[:10], "n_silent_any": len(silent_any), "silent_any": silent_any[:10],
           "over_jsonl": over[:10], "over_printed": over_printed[:10], "n_over_printed": len(over_printed),
           "dup_events": dup_ev[:10], "n_dup_events": len(dup_ev), "ended_without_prior_failure": ended_wo[:10],
           "ended_printed_as_failure": ended_printed[:10], "n_under": len(under), "under": under[:10],
           "dups_written": dups_written[:10], "codes": [(n, rc) for n, _, rc in [(a, 0, b) for a, b, _ in reps]]}
    print(json.dumps(res))
    for k in ("silent_final_ok", "over_jsonl", "over_printed", "dup_events", "ended_without_prior_failure", "ended_printed_as_failure", "dups_written"):
        if res[k]: tot[k] += 1
print("TOTAL", dict(tot), "dirs", len(sys.argv) - 1)
