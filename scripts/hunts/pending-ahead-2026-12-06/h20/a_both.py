"""a_both.py DIR...: for each rid both in got.log and fails.jsonl: was it released (R) by an incarnation that ran before
the one that reported it? Prints rid, G/R pids, reporting pid, kind, why."""
import sys, json, collections
for d in sys.argv[1:]:
    order = []; G = collections.defaultdict(list); R = collections.defaultdict(list)
    for l in open(d + "/got.log").read().split("\n"):
        p = l.split()
        if not p: continue
        if p[0] == "S": order.append(int(p[1]))
        elif p[0] == "G": G[p[1]].append(int(p[2]))
        elif p[0] == "R": R[p[1]].append(int(p[2]))
    F = [json.loads(l) for l in open(d + "/fails.jsonl").read().split("\n") if l]
    acked_then_reported = 0; other = 0
    for f in F:
        if f["rid"] in G:
            rel_before = [p for p in R[f["rid"]] if order.index(p) < order.index(f["pid"])]
            if rel_before: acked_then_reported += 1
            else: other += 1
            print(d.split("/")[-1], f["rid"], "G", G[f["rid"]], "R", R[f["rid"]], "reported by", f["pid"], f["kind"], f["event"].split(":")[1], f["why"][:50])
    print(d.split("/")[-1], "RELEASED-THEN-REPORTED", acked_then_reported, "other", other)
