"""How many torch threads verispec runs (models.load.threads_to_use): what OMP_NUM_THREADS asks, else every CPU the
process may use, and under OpenMP binding the CPUs the binding names (the bound first thread's affinity shows one)."""

from __future__ import annotations

import os

import pytest
import torch

from verispec.models.load import bound_cpus, default_threads, threads_to_use


def test_omp_num_threads_wins_and_the_affinity_is_the_default():
    assert threads_to_use({"OMP_NUM_THREADS": "3", "GOMP_CPU_AFFINITY": "0"}) == 3
    default = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert threads_to_use({}) == default
    assert threads_to_use({"OMP_NUM_THREADS": "0"}) == default  # not a thread count: ignored
    assert threads_to_use({"OMP_NUM_THREADS": "four"}) == default
    assert threads_to_use({"OMP_PROC_BIND": "false", "GOMP_CPU_AFFINITY": "0"}) == default  # binding off


@pytest.mark.parametrize("env, want", [
    ({"GOMP_CPU_AFFINITY": "0 1"}, 2), ({"GOMP_CPU_AFFINITY": "0-3,8"}, 5), ({"GOMP_CPU_AFFINITY": "0-7:2"}, 4),
    ({"OMP_PLACES": "{0},{1}", "OMP_PROC_BIND": "close"}, 2), ({"OMP_PLACES": "{0:4}"}, 4),
    ({"OMP_PLACES": "{0,1},{2,3}"}, 4), ({"OMP_PLACES": "{0:2:2}"}, 2),
])
def test_a_binding_counts_the_cpus_it_names(env, want):
    assert threads_to_use(env) == want


@pytest.mark.parametrize("binding", ["cores", "true", "spread", "{a}", "0-"])
def test_an_abstract_binding_names_no_cpus_and_takes_the_machine(binding):
    assert bound_cpus(binding) is None
    assert threads_to_use({"OMP_PROC_BIND": binding}) == os.cpu_count()


def test_default_threads_sets_torch(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("GOMP_CPU_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    default_threads()
    assert torch.get_num_threads() == 1
