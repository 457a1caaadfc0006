import pytest

from loops.core import progress as progress_lib


def test_rates_and_epoch_times_exclude_the_first_call_and_epochs_are_interpolated():
  p = progress_lib.Progress(start_step=0, total_steps=100, global_batch_size=10, steps_per_epoch=20)
  assert p.record(10, 5.0) == {}  # first call: tracing, slow
  assert not p.steady()  # its rate (tracing included) is the only one: summary.json says none
  assert p.record(20, 1.0) == {}  # epoch 1 overlapped the first call: not timed
  finished = p.record(50, 3.0)  # 1 s per 10 steps: epoch 2 ends at 40, the call ends mid-epoch 3
  assert p.steady()
  assert finished == {2: pytest.approx(2.0)}
  assert p.steps_per_sec() == pytest.approx(40 / 4.0)
  assert p.examples_per_sec() == pytest.approx(100.0)
  assert p.eta_seconds() == pytest.approx(5.0)
  assert p.mean_epoch_seconds() == pytest.approx(2.0)  # epoch 2's: the first, traced, is not timed (not twice out)
  assert p.record(100, 5.0) == {3: pytest.approx(2.0), 4: pytest.approx(2.0), 5: pytest.approx(2.0)}
  assert p.mean_epoch_seconds() == pytest.approx(2.0)


def test_a_first_call_ending_on_an_epoch_boundary_times_the_next_epoch():
  p = progress_lib.Progress(start_step=0, total_steps=100, global_batch_size=1, steps_per_epoch=20)
  assert p.record(20, 9.0) == {}
  assert p.record(40, 2.0) == {2: pytest.approx(2.0)}


def test_a_resumed_run_does_not_time_the_partial_epoch():
  p = progress_lib.Progress(start_step=30, total_steps=100, global_batch_size=1, steps_per_epoch=20)
  assert p.record(35, 9.0) == {}  # first call
  assert p.record(40, 1.0) == {}  # epoch 2 started before this process
  assert p.record(60, 2.0) == {3: pytest.approx(2.0)}


def test_format_duration():
  assert progress_lib.format_duration(75) == "1:15"
  assert progress_lib.format_duration(3725) == "1:02:05"
  assert progress_lib.format_duration(float("inf")) == "?"
