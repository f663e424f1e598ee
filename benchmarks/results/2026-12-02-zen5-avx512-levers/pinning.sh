# Threads pinned one to a core against the default (unpinned), alternately, three times.
for i in 1 2 3; do
  NT=2 python step.py
  NT=2 OMP_PROC_BIND=close OMP_PLACES="{0},{1}" python step.py
done
