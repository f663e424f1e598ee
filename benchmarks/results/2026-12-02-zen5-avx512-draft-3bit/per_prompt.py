"""Per-prompt decode tok/s and draft ms a round of one `auto` draft row over another, from profile_round.py's stderr log:
python per_prompt.py LOG BASE_DRAFT OTHER_DRAFT (e.g. w4a8-4bit@65536 w4a8-3bit@65536). Prompts run in the suite's
category order, the three code categories last."""
import collections, math, re, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.search(r'prompt (\d+)/\d+ w4a8 (\S+) auto: ([\d.]+) tok/s, \{.draft_ms.: ([\d.]+)', line)
    if m:
        d[int(m.group(1))][m.group(2)] = (float(m.group(3)), float(m.group(4)))
gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
a, b = sys.argv[2], sys.argv[3]
r = [d[p][b][0] / d[p][a][0] for p in sorted(d)]
dr = [d[p][b][1] / d[p][a][1] for p in sorted(d)]
prose = 2 * len(d) // 3
print(f"{b} / {a} decode tok/s: all {gm(r):.3f}, prose {gm(r[:prose]):.3f}, code {gm(r[prose:]):.3f}; faster on {sum(x > 1 for x in r)} of {len(r)}; draft ms a round {gm(dr):.3f}")
