"""Merge the issue-9 final sweeps into promise_final.json / promise_final.txt.

Runs of bench/results/promise_final_rerun.json replace the same (spec, model, workers,
schedule, seed) in the sweeps: two homomorphic runs of the sweeps were made with an
earlier agreement statistic of fc_value 'mean' (t of the previous step instead of each
worker's own t); the reruns use the committed code."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import promise  # noqa: E402

SWEEPS = ['promise_final_4w_short.json', 'promise_final_8w_short.json',
          'promise_final_4w_long.json', 'promise_final_lenet.json']
# lenet runs of the first three sweeps used the activation-free layout (unstable in
# dist_sync itself); promise_final_lenet.json reruns lenet with tanh (train_mnist.py)
OLD_LENET = SWEEPS[:2]
runs = {}
for name in SWEEPS + ['promise_final_rerun.json']:
    path = os.path.join(HERE, name)
    if not os.path.isfile(path):
        continue
    for r in json.load(open(path))['runs']:
        if name in OLD_LENET and r['model'] == 'lenet':
            continue
        if not r.get('error'):
            runs[promise.run_key(r)] = r
runs = list(runs.values())
summary = promise.summarize(runs)
text = promise.format_tables(summary)
print(text)
with open(os.path.join(HERE, 'promise_final.json'), 'w') as f:
    json.dump({'sources': SWEEPS + ['promise_final_rerun.json'], 'summary': summary,
               'runs': runs}, f, indent=1)
with open(os.path.join(HERE, 'promise_final.txt'), 'w') as f:
    f.write(text + '\n')
