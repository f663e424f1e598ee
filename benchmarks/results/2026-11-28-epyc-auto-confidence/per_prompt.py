"""Per-prompt decode tok/s of each auto~C row over `auto` (no stop), from profile_round.py's stderr log:
python per_prompt.py LOG. Prompts run in the suite's category order, the three code categories last."""
import collections, math, re, sys

d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.search(r'prompt (\d+)/\d+ w4a8 (\S*) ?(\S+): ([\d.]+) tok/s', line)
    if m:
        d[int(m.group(1))][m.group(3)] = float(m.group(4))
gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
prose = 2 * len(d) // 3
for name in [k for k in d[1] if k not in ('ar', 'auto')]:
    r = [d[p][name] / d[p]['auto'] for p in sorted(d)]
    print(f"{name} / auto: prose (prompts 1-{prose}) {gm(r[:prose]):.3f}, code ({prose + 1}-{len(r)}) "
          f"{gm(r[prose:]):.3f}; faster on {sum(x > 1 for x in r)} of {len(r)}")
