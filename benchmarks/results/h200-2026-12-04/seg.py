import numpy as np, sys
sys.path.insert(0,'benchmarks')
from hscapture.sglang.timing import read_forward_log
import bench_server as bs, _stats
f=read_forward_log(sys.argv[1])
a=f[f['phase']>0]
cuts=[int(x) for x in sys.argv[2].split(',')]
labels=sys.argv[3].split(',')
bounds=[0]+[c+1 for c in cuts]+[None]
pool={}
for k,(lo,hi) in enumerate(zip(bounds[:-1],bounds[1:])):
    seg=a[lo:hi]
    g=bs.interleaved(f, seg['t_ns'][0]/1e9, seg['t_ns'][-1]/1e9)
    lab=labels[k%len(labels)]
    pool.setdefault(lab,[]).extend(g['ratios'])
    print(lab, len(g['ratios']), 'median %.4f'%np.median(g['ratios']), 'turn', {k:round(v) for k,v in g['turn_us_median'].items()}, 'hook', {k:round(v) for k,v in g['hook_us_mean'].items()})
for lab,r in pool.items():
    s=_stats.pair_summary(r,0.98,'>=',seed=0)
    print(lab, {k:v for k,v in s.items() if k!='values'})
