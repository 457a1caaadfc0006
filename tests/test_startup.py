"""A multi-worker start that cannot hang: a taken port, a peer that never comes, SIGTERM while waiting."""

import pytest
import json
import os
import signal
import socket
import subprocess
import sys
import time

from launch.local import free_ports
from tests.conftest import REPO

DIGITS = ["--config=configs/digits_cnn.py", "--config.strategy=multi_worker_mirrored", "--config.train.steps=4"]


def worker(index, ports, workdir, *flags):
  """main.py as worker `index` of a 2-worker cluster on `ports`, started in the background."""
  spec = {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]}, "task": {"type": "worker", "index": index}}
  env = {**os.environ, "TF_CONFIG": json.dumps(spec)}
  return subprocess.Popen([sys.executable, "main.py", *DIGITS, f"--workdir={workdir}", *flags], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def listening(port):
  try:
    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    return True
  except OSError:
    return False


@pytest.mark.e2e
def test_a_port_in_use_is_one_line_naming_it(tmp_path):
  ports = free_ports(2)
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", ports[1]))
    taken.listen()
    done = worker(1, ports, tmp_path)
    _, stderr = done.communicate(timeout=120)
  assert done.returncode == 1
  assert error_lines(stderr) == [f"error: port {ports[1]} of worker 1 (127.0.0.1:{ports[1]}) is in use by another "
                                 "process; free it or give this cluster other ports (TF_CONFIG, or "
                                 "cluster.slurm_port_base under SLURM)"]
  assert "Traceback" not in stderr


@pytest.mark.e2e
def test_a_peer_that_never_comes_ends_the_wait_with_one_line_and_the_restart_code(tmp_path):
  ports = free_ports(2)
  done = worker(0, ports, tmp_path, "--config.cluster.startup_timeout_seconds=3")
  _, stderr = done.communicate(timeout=120)
  assert done.returncode == 143
  assert error_lines(stderr) == [f"error: the cluster did not start within cluster.startup_timeout_seconds=3: "
                                 f"nothing listens for worker 1 (127.0.0.1:{ports[1]}): did it start? (see its log)"]


@pytest.mark.e2e
def test_sigterm_ends_a_worker_waiting_for_its_peer(tmp_path):
  ports = free_ports(2)
  waiting = worker(0, ports, tmp_path, "--config.cluster.startup_timeout_seconds=300")
  try:
    deadline = time.monotonic() + 90
    while not listening(ports[0]):  # its placeholder listener: it is waiting for worker 1
      assert waiting.poll() is None and time.monotonic() < deadline, waiting.stderr.read()[-2000:]
      time.sleep(0.2)
    waiting.send_signal(signal.SIGTERM)
    waiting.wait(timeout=10)
  finally:
    waiting.kill()
  assert waiting.returncode == -signal.SIGTERM


@pytest.mark.e2e
def test_a_start_that_hangs_inside_tensorflow_is_ended_by_the_watchdog_with_one_line(tmp_path):
  """Worker 1's port belongs to another program that accepts connections: the peers answer, TensorFlow waits."""
  ports = free_ports(2)
  with socket.socket() as impostor:
    impostor.bind(("127.0.0.1", ports[1]))
    impostor.listen()
    started = time.monotonic()
    done = worker(0, ports, tmp_path, "--config.cluster.startup_timeout_seconds=4")
    _, stderr = done.communicate(timeout=120)
  assert done.returncode == -signal.SIGKILL and time.monotonic() - started < 90
  assert error_lines(stderr) == ["error: the cluster did not start within cluster.startup_timeout_seconds=4: every "
                                 "peer's port answers but TensorFlow's start did not finish: a port may belong to "
                                 "another program, or a peer failed while starting (see the other workers' logs); "
                                 "ending this worker"]
