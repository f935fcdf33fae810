"""Offline check of s2/s3 run dirs: a rid whose LAST attempt was fully captured and not aborted must be
GOT by the stream, or named once more than its failed attempts (e.g. gap 1's incomplete). usage: python s2_retry_check.py DIR..."""
import json, re, glob, sys, collections
for d in sys.argv[1:]:
    try: ev = json.load(open(d + '/producer_events.json'))
    except Exception: continue
    cap = [e for e in ev if e['event'] == 'captured']
    if not cap: continue
    att = cap[0]['attempts']
    got = {l[4:].split()[0] for l in open(d + '/got.log') if l.startswith('GOT ')}
    nc = collections.Counter()
    for e in glob.glob(d + '/err*.txt'):
        for line in open(e):
            if "sample(s)" in line and "): " in line and "stream stopped" not in line:
                for r in re.findall(r"\b(r-\d+)\b", line.split("): ", 1)[1]): nc[r] += 1
    lost = [r for r, a in att.items() if a[-1] == [True, False] and r not in got and nc[r] <= sum(1 for x in a[:-1] if x != [True, False]) and len(a) > 1]
    print(d, "runs-retries-silently-lost:", lost)
