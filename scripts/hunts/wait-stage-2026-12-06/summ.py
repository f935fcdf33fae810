import json,sys
for l in sys.stdin:
    if not l.startswith("{"): print(l.rstrip()); continue
    d=json.loads(l); pe=d.pop('prod_events'); print(json.dumps(d, default=str)[:1500]); print("  prod:", [(e['event'], e.get('maxbl'), e.get('dt'), e.get('err'), {k:v for k,v in (e.get('stats') or {}).items() if k in ('staged_rows','stage_writes','dropped','backlog','aborted','next_seq')}) for e in pe])
