"""Per pass of an alt=8 forward log (hscapture.sglang.timing.ForwardLog): each window's
pass log interval told apart by the captured passes' median hook time (> 115 us: log 0; the
threshold fits the tiny Llama on the H200), then per window the hook's time and the rest of
each pass's turn (hook exit -> next hook entry, "own-rest") for captured and skipped passes,
and both by position in the block. Usage: python own_rest.py forwards.bin (from the project
root, which it imports hscapture from)."""
import numpy as np, sys
sys.path.insert(0,'.')
from hscapture.sglang.timing import read_forward_log
f=read_forward_log(sys.argv[1]); f=f[np.argsort(f['t_ns'],kind='stable')]
t0=f['t_ns'][0]
a=f[f['phase']>0]
ta=(a['t_ns']-t0)/1e9
turn=np.diff(a['t_ns'])/1e3; hook=a['hook_ns'][:-1]/1e3; rest=turn-hook
ph=a['phase'][:-1]; nxt=np.r_[rest[1:],np.nan]; tt=ta[:-1]
sec=np.floor(tt).astype(int)
cls={}
for s in np.unique(sec):
    m=(sec==s)&(ph==1)
    if m.sum()<20: continue
    cls[s]= 'L0' if np.median(hook[m])>115 else 'L50'
# group consecutive seconds of the same class into windows
wins=[]; cur=None
for s in sorted(cls):
    if cur and cls[s]==cur[0] and s==cur[2]+1: cur[2]=s
    else:
        cur=[cls[s],s,s]; wins.append(cur)
for lab,s0,s1 in wins:
    if s1-s0<5: print('short run',lab,s0,s1); continue
    m=(sec>=s0+1)&(sec<=s1-1)
    c=m&(ph==1); k=m&(ph==2)
    print('%-4s %3d-%3ds hook cap med %4.0f mean %4.0f skp %3.0f | own-rest cap %5.0f skp %5.0f | next-rest cap med %5.0f mean %5.0f / skp med %5.0f mean %5.0f | diff(next-rest mean) %+4.0f diff(hook mean) %+4.0f'%(
      lab,s0,s1,np.median(hook[c]),hook[c].mean(),hook[k].mean(),np.median(rest[c]),np.median(rest[k]),np.nanmedian(nxt[c]),np.nanmean(nxt[c]),np.nanmedian(nxt[k]),np.nanmean(nxt[k]), np.nanmean(nxt[c])-np.nanmean(nxt[k]), hook[c].mean()-hook[k].mean()))
print('--- own-rest (hook exit -> next hook entry), median by position in block')
pos=np.zeros(len(ph),int)
for i in range(1,len(ph)):
    pos[i]=pos[i-1]+1 if ph[i]==ph[i-1] else 0
for lab,s0,s1 in wins:
    if s1-s0<5: continue
    m=(sec>=s0+1)&(sec<=s1-1)
    line=[]
    for p in (1,2):
        line.append(' '.join('%5.0f'%np.median(rest[m&(ph==p)&(pos==j)]) for j in range(8)))
    hk=' '.join('%4.0f'%np.median(hook[m&(ph==1)&(pos==j)]) for j in range(8))
    print(lab, s0, 'cap', line[0], '| skp', line[1], '| hook cap', hk)
