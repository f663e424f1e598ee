# After verispec counts the CPUs a binding names (models.load.threads_to_use): GOMP_CPU_AFFINITY alone, no NT, against
# no pinning, alternately, twice each.
for i in 1 2; do
  python step.py
  GOMP_CPU_AFFINITY="0 1" python step.py
done
