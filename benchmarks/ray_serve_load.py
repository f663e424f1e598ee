"""Throughput of `verispec serve --backend ray` at 1 and 2 replicas, beside the single-process server, at 1, 4 and
8 clients; and the memory of each replica.

    python benchmarks/ray_serve_load.py --out benchmarks/results/DATE-CPU-ray-serve [-- serve flags...]

For each server in turn (single, ray x1, ray x2 by default): start it with the default pair (plus the serve
flags after --), wait until every replica is ready, run benchmarks/serve_load.py at each client count, read the
resident (RSS) and proportional (PSS: shared pages split between the processes that map them) memory of each
replica and of the whole process tree, stop it. One JSON line per run in OUT/runs.jsonl, the server logs beside.
Run it on an otherwise idle machine: everything here shares its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kib(pid: int) -> dict[str, int]:
    """Rss and Pss of one process in KiB (/proc/PID/smaps_rollup)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower()] = int(rest.split()[0])
    except OSError:
        pass
    return out


def tree(root: int) -> list[int]:
    """root and every process descended from it (Ray's own processes and replicas are the driver's)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def replica_pids(base: str, server_pid: int) -> list[int]:
    health = httpx.get(base + "/health", timeout=10).json()
    listed = health.get("replicas", {}).get("list")
    return [r["pid"] for r in listed] if listed else [server_pid]


def wait_ready(base: str, replicas: int, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see its log")
        try:
            r = httpx.get(base + "/health", timeout=5)
            if r.status_code == 200 and r.json().get("replicas", {"ready": 1})["ready"] >= replicas:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--servers", default="single,ray1,ray2", help="single | rayN, comma-separated")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: more `verispec serve` flags")
    args = ap.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    isa = "avx512_vnni" if "avx512_vnni" in open("/proc/cpuinfo").read() else "avx2"
    print(f"machine: {cpu}, {os.cpu_count()} cores, {isa}", file=sys.stderr)
    for server in args.servers.split(","):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        replicas = 1 if server == "single" else int(server.removeprefix("ray"))
        backend = [] if server == "single" else ["--backend", "ray", "--replicas", str(replicas)]
        cmd = [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port), "--log-level", "warning",
               *backend, *flags]
        log = open(args.out / f"server-{server}.log", "w")
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base, replicas, proc)
            ready_s = time.monotonic() - started
            for clients in args.clients.split(","):
                line = subprocess.run([sys.executable, str(HERE / "serve_load.py"), "--url", base, "--clients",
                                       clients, "--requests", str(args.requests), "--max-tokens",
                                       str(args.max_tokens), "--json", "--metrics-delay",
                                       "0" if server == "single" else "2.5"], capture_output=True, text=True, check=True)
                result = json.loads(line.stdout)
                pids = replica_pids(base, proc.pid)
                record = {"server": server, "replicas": replicas, "clients": int(clients), "isa": isa,
                          "start_to_ready_s": round(ready_s, 1), "result": result,
                          "replica_memory_kib": [memory_kib(p) for p in pids],
                          "tree_pss_kib": sum(memory_kib(p).get("pss", 0) for p in tree(proc.pid)),
                          "command": " ".join(cmd[1:])}
                print(json.dumps(record), flush=True)
                with open(args.out / "runs.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()


if __name__ == "__main__":
    main()
