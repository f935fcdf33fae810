import json,sys,glob
d=sys.argv[1]
att={}
kt=None
for l in open(d+"/ledger.jsonl"):
    x=json.loads(l)
    if "kill" in x: kt=x["t"]
    if "c" in x: att.setdefault((x["c"],x["att"]),{"ch":[],"ab":None,"done":False,"t":0})["ch"].append(x["ok"]); att[(x["c"],x["att"])]["t"]=x["t"]; att[(x["c"],x["att"])]["done"] |= x["last"]
    elif "a" in x: att[(x["a"],x["att"])]["ab"]=x["restart"]; att[(x["a"],x["att"])]["t"]=x["t"]
deliv={}; st={}
for l in open(d+"/sub.jsonl"):
    x=json.loads(l)
    if x["event"]=="sample": deliv[x["rid"]]=deliv.get(x["rid"],0)+1
    elif x["event"]=="stats": st=x["stats"]
rep=set()
for k in ("dropped","incomplete","rejected","in_flight","undelivered"):
    rep|=set(st.get(k) or [])
unnamed=[]; lastatt={}
for (rid,a),v in att.items(): lastatt[rid]=max(lastatt.get(rid,0),a)
for (rid,a),v in sorted(att.items()):
    if v["ab"] is True: continue
    if rid in deliv or rid in rep: continue
    unnamed.append((rid,a,v["ab"],v["done"],len(v["ch"]), round(kt-v["t"],3) if kt else None))
print("oldest unnamed before kill:", max((u[5] for u in unnamed if u[5] is not None), default=None)); print("lost:", st.get("lost")); print("unnamed attempts:", len(unnamed), unnamed[:40])
