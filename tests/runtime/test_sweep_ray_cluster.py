"""``libra-sim sweep --ray ADDRESS`` against a real Ray cluster: the test starts a head node on
127.0.0.1 with two worker CPUs (``ray start --head --block`` in a process group of its own, so it
is stopped by that group's id, never by ``ray stop``, which would also stop other Ray clusters on
the machine), runs a tiny grid there and with ``--jobs 2``, and checks both give the same runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import importlib.util

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="needs ray (the run extra): pip install -e '.[run]'")

GRID = {
    "name": "ray-vs-jobs",
    "policies": ["libra", "verl-static-uniform"],
    "workloads": {"swe": {"generate": {"workload": "swe", "steps": 2, "batch": 16, "group_size": 8, "seed": 0,
                                       "max_context": 16384}}},
    "clusters": {"c8": {"gpus": 8, "gpu": "h100", "model": "qwen3-8b"}},
    "sweeps": [{"workloads": ["swe"], "clusters": ["c8"], "max_staleness": [0, 1]}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray head with 2 CPUs; yields its address, then stops exactly the processes it started."""
    port = _free_port()
    tmp = Path(f"/tmp/ray-libra-{os.getpid()}")  # short: Ray's socket paths must fit in 107 characters
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    ray_cli = str(Path(sys.executable).parent / "ray")
    log = tmp_path_factory.mktemp("ray") / "head.log"
    with open(log, "w") as out:
        head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                                 "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
                                 f"--temp-dir={tmp}"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the GCS port answers once the head is up
            if head.poll() is not None:
                pytest.fail(f"ray start exited {head.returncode}: {log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the Ray head did not come up in 120 s: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        ray.shutdown()
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)  # the group `ray start` and everything it spawned belong to
            except ProcessLookupError:
                break
            try:
                head.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _runs(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    doc = json.loads((out / "results.json").read_text())
    # host_s is this machine's seconds and cached where it came from: everything else is the result
    return {(c["config"], p): {k: v for k, v in r.items() if k not in ("host_s", "cached")}
            for c in doc["configurations"] for p, r in c["runs"].items()}


def test_sweep_on_a_ray_cluster_matches_local_jobs(ray_head: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID, sort_keys=False))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "local"), "--jobs", "2", "--quiet"]) == 0
    assert main(["sweep", str(grid), "--out", str(tmp_path / "ray"), "--ray", ray_head, "--quiet"]) == 0
    capsys.readouterr()
    local, remote = _runs(tmp_path / "local"), _runs(tmp_path / "ray")
    assert len(local) == 4 and all(r["status"] == "ok" for r in local.values())
    assert remote == local
    meta = json.loads((tmp_path / "ray" / "results.json").read_text())
    assert meta["executor"] == f"ray {ray_head}" and meta["computed_runs"] == 4
