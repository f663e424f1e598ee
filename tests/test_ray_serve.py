"""`verispec serve --backend ray` end to end (the cluster tests are slow: a local Ray instance, ~1 minute): two replicas of the
tiny models behind one endpoint. 40 concurrent requests come back complete and equal to the engine's greedy
output; a conversation stays on its replica; a replica killed mid-load loses no request (each completes, or ends
with the 503 envelope) and Ray Serve brings it back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.test_server import GAMMA, MODEL, _free_port, _load, dirs, reference  # noqa: F401 (dirs: a fixture)
from tests.tiny_hf import WORDS
from verispec.engine import GenerationParams, generate
from verispec.proposers.draft_model import DraftModelProposer

pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install -e '.[ray]'")

BACK_WITHIN_S = 120  # a killed replica is ready again within this (measured: see the test's output)


@pytest.fixture(scope="module")
def models(dirs):  # noqa: F811
    return _load(dirs)


@pytest.fixture(scope="module")
def cluster(dirs, tmp_path_factory) -> Iterator[str]:  # noqa: F811
    """`verispec serve --backend ray --replicas 2` on a free port; its base URL once both replicas are ready."""
    target, draft = dirs
    port = _free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--backend", "ray", "--replicas", "2", "--replica-cpus",
           "1", "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--draft-dtype", "float32",
           "--strategy", "draft", "--gamma", str(GAMMA), "--max-concurrency", "8", "--max-prompt-tokens", "200",
           "--max-new-tokens-limit", "128", "--speculate-max-batch", "4", "--served-model-name", MODEL,
           "--port", str(port), "--log-level", "warning"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while _ready(base) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, f"did not start:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _health(base: str) -> dict:
    try:
        return httpx.get(base + "/health", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _ready(base: str) -> int:
    return _health(base).get("replicas", {}).get("ready", 0)


def _prompts(n: int) -> list[str]:
    return [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(3 + i % 4)) for i in range(n)]


def _request(base: str, prompt: str, max_tokens: int, stream: bool, on_token=None, **extra) -> dict:
    """One completion; {"status", "ids", "error", "replica", "finish"} whether it streamed or not. A stream calls
    `on_token(replica)` once its first tokens have arrived."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "stream": stream, **extra}
    with httpx.Client(base_url=base, timeout=120) as c:
        if not stream:
            r = c.post("/v1/completions", json=body)
            out = r.json()
            ids = out["choices"][0]["token_ids"] if r.status_code == 200 else []
            return {"status": r.status_code, "ids": ids, "error": out.get("error"),
                    "replica": r.headers.get("x-verispec-replica"), "finish": r.status_code == 200}
        ids, error, done = [], None, False
        with c.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    error = event["error"]
                else:
                    ids += event["choices"][0].get("token_ids") or []
                    if on_token is not None and ids:
                        on_token(r.headers.get("x-verispec-replica"))
                        on_token = None
            return {"status": r.status_code, "ids": ids, "error": error,
                    "replica": r.headers.get("x-verispec-replica"), "finish": done and error is None}


@pytest.mark.slow
def test_forty_concurrent_requests_equal_generate(cluster, models):
    tok = models.target.tokenizer
    prompts = _prompts(40)
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda ip: _request(cluster, ip[1], 24, stream=ip[0] % 2 == 1), enumerate(prompts)))
    for prompt, got in zip(prompts, results):
        assert got["status"] == 200 and got["finish"], got
        assert got["ids"] == reference(models, tok.encode(prompt), 24), prompt
    assert len({r["replica"] for r in results}) == 2  # both replicas served
    metrics = httpx.get(cluster + "/metrics").text
    assert 'verispec_generation_tokens_total{replica="' in metrics and "verispec_ingress_replicas_ready 2.0" in metrics


@pytest.mark.slow
def test_a_conversation_stays_on_its_replica(cluster):
    messages = [{"role": "user", "content": "x = 1"}]
    replicas = set()
    with httpx.Client(base_url=cluster, timeout=60) as c:
        for turn in range(4):
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 6,
                                                     "temperature": 0})
            assert r.status_code == 200, r.text
            replicas.add(r.headers["x-verispec-replica"])
            messages = messages + [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                                   {"role": "user", "content": f"y = {turn}"}]
    assert len(replicas) == 1


def _cancelled(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("verispec_requests_total{") and 'finish_reason="cancelled"' in line)


@pytest.mark.slow
def test_a_client_that_leaves_frees_its_row(cluster):
    before = _cancelled(cluster)
    body = {"model": MODEL, "prompt": "x = 1", "max_tokens": 120, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with ThreadPoolExecutor(16) as pool:  # full batches on both replicas: the stream takes a while
        busy = [pool.submit(_request, cluster, p, 100, False, ignore_eos=True) for p in _prompts(16)]
        time.sleep(0.2)
        with httpx.Client(base_url=cluster, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data: ")
                if events == 3:
                    break  # leave mid-stream: Ray Serve cancels the ingress's call, the replica's app sees it
        assert all(f.result(timeout=120)["finish"] for f in busy)
    deadline = time.monotonic() + 20
    while _cancelled(cluster) < before + 1:  # the replica dropped the row (its metrics arrive within a second)
        assert time.monotonic() < deadline, "the replica never saw the client leave"
        time.sleep(0.5)


@pytest.mark.slow
def test_killing_a_replica_mid_load_loses_no_request(cluster, models):
    t, d = models.target, models.draft
    tok = t.tokenizer
    prompts, max_tokens = _prompts(40), 100

    def expected(prompt: str) -> list[int]:  # ignore_eos: exactly max_tokens tokens
        ids = tok.encode(prompt)
        params = GenerationParams(max_new_tokens=max_tokens, gamma=GAMMA, eos_ids=())
        proposer = DraftModelProposer(d.model, len(ids) + max_tokens + GAMMA + 2, vocab_size=t.model.vocab_size)
        return generate(t.model, ids, params, proposer).token_ids

    pids = {r["id"]: r["pid"] for r in _health(cluster)["replicas"]["list"]}
    hit, probe = threading.Event(), {}

    def first_token(replica: str) -> None:  # kill the probe's replica at once: a request is mid-stream on it
        os.kill(pids[replica], signal.SIGKILL)
        probe.update(replica=replica, killed=time.monotonic())
        hit.set()

    with ThreadPoolExecutor(41) as pool:
        futures = [pool.submit(_request, cluster, p, max_tokens, i % 2 == 1, ignore_eos=True)
                   for i, p in enumerate(prompts)]
        futures.append(pool.submit(_request, cluster, prompts[0], max_tokens, True, on_token=first_token,
                                   ignore_eos=True))
        assert hit.wait(timeout=60), "the probe stream never got a token"
        victim, killed = {"id": probe["replica"], "pid": pids[probe["replica"]]}, probe["killed"]
        results = [f.result(timeout=180) for f in futures]  # none hangs
    assert results[-1]["error"]["code"] == "replica_unavailable" and results[-1]["ids"]  # the probe: cut after tokens
    assert results[-1]["ids"] == expected(prompts[0])[:len(results[-1]["ids"])]
    completed = failed = 0
    for prompt, got in zip(prompts, results[:-1]):
        if got["finish"]:
            assert got["status"] == 200 and got["ids"] == expected(prompt), prompt
            completed += 1
        else:  # the 503 envelope: as the status, or as the stream's last event after some tokens
            assert got["error"]["code"] == "replica_unavailable" and got["error"]["type"] == "service_unavailable"
            assert got["status"] == 503 or got["ids"] == expected(prompt)[:len(got["ids"])]
            failed += 1
    assert completed + failed == 40
    metrics = httpx.get(cluster + "/metrics").text
    retried = float(next(line.split()[-1] for line in metrics.splitlines()
                         if line.startswith("verispec_ingress_retries_total")))
    while _ready(cluster) < 2 or victim["pid"] in [r["pid"] for r in _health(cluster)["replicas"]["list"]]:
        assert time.monotonic() - killed < BACK_WITHIN_S, _health(cluster)
        time.sleep(0.5)
    print(f"\nkilled replica {victim['id']}: {completed} requests completed, {failed} ended with the 503 envelope, "
          f"{retried:.0f} retried; two replicas ready again {time.monotonic() - killed:.1f} s after the kill")
    assert _request(cluster, prompts[0], 24, False)["ids"] == reference(models, tok.encode(prompts[0]), 24)


def test_deployment_options_refuse_what_the_cluster_cannot_hold():
    from verispec.server.app import ServerSettings
    from verispec.server.ray_serve import RayOptions, deployment_options

    s = ServerSettings(max_concurrency=8)
    opts, threads = deployment_options(RayOptions(replicas=2), s, cluster_cpus=2)
    assert opts["num_replicas"] == 2 and opts["ray_actor_options"]["num_cpus"] == 1 and threads == 1
    assert opts["max_ongoing_requests"] == 8
    opts, _ = deployment_options(RayOptions(min_replicas=1, max_replicas=4), s, cluster_cpus=4)
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 4.0}
    with pytest.raises(ValueError, match="do not fit"):
        deployment_options(RayOptions(replicas=3, replica_cpus=1), s, cluster_cpus=2)
    with pytest.raises(ValueError, match="both"):
        deployment_options(RayOptions(min_replicas=1), s, cluster_cpus=2)
