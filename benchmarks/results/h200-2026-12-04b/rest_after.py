"""The rest of a pass's turn (hook exit -> next hook entry) after captured passes whose hook
ran long (drains, stage writes, inline publishes), after the other captured passes and after
skipped ones, per window kind of an alt=8 forward log; and by position in the block.

    python benchmarks/results/h200-2026-12-04b/rest_after.py FORWARDS THRESHOLD_US LONG_US

FORWARDS: a forward log (.bin or .bin.xz); THRESHOLD_US tells the pass log's windows apart by
the captured passes' median hook time per second (log 0 above it: 220 at 1B, 160 tiny);
LONG_US: a captured pass whose hook took longer is "long" (600 at 1B, 400 tiny). A window is
"-short" where its captured passes hold more than 4 rows on average (1B's short mix). Run from
the project root (it imports hscapture from there).
"""
import numpy as np, sys
sys.path.insert(0,'.')
from hscapture.sglang.timing import read_forward_log
f=read_forward_log(sys.argv[1]); thr=float(sys.argv[2]); drain_us=float(sys.argv[3])
f=f[np.argsort(f['t_ns'],kind='stable')]
t0=f['t_ns'][0]
turn=np.diff(f['t_ns'])/1e3; hook=f['hook_ns'][:-1]/1e3; rest=turn-hook
ph=f['phase'][:-1]; ext=f['extend'][:-1]; rows=f['rows'][:-1]; sec=np.floor((f['t_ns'][:-1]-t0)/1e9).astype(int)
cls={}
for s in np.unique(sec):
    m=(sec==s)&(ph==1)&(ext==1)
    if m.sum()<20: continue
    cls[s]=('L0' if np.median(hook[m])>thr else 'L50')+('-short' if np.mean(rows[m])>4 else '-long')
lab=np.array([cls.get(s,'') for s in sec])
# position in block for captured prefill passes
pos=np.zeros(len(ph),int)
for i in range(1,len(ph)):
    pos[i]=pos[i-1]+(ext[i]==1) if ph[i]==ph[i-1] else 0
for L in sorted(set(cls.values())):
    m=(lab==L)
    cap=m&(ph==1)&(ext==1); skp=m&(ph==2)&(ext==1)
    dr=cap&(hook>drain_us); nd=cap&(hook<=drain_us)
    print(L, 'captured %d (hook > %d us: %d), skipped %d'%(cap.sum(),drain_us,dr.sum(),skp.sum()))
    for name,mm in (('captured, long hook',dr),('captured, short hook',nd),('skipped',skp)):
        if mm.sum(): print('   %-22s hook mean %6.0f  rest after: median %6.0f mean %6.0f'%(name,hook[mm].mean(),np.median(rest[mm]),rest[mm].mean()))
    print('   rest after captured by position in block (median): ' + ' '.join('%d:%.0f'%(p,np.median(rest[cap&(pos==p)])) for p in range(8) if (cap&(pos==p)).sum()>10))
    print('   rest after skipped  by position in block (median): ' + ' '.join('%d:%.0f'%(p,np.median(rest[skp&(pos==p)])) for p in range(8) if (skp&(pos==p)).sum()>10))
    print('   long-hook share by position: ' + ' '.join('%d:%.2f'%(p,(dr&(pos==p)).sum()/max(1,(cap&(pos==p)).sum())) for p in range(8)))
