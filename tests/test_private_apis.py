"""Each private TensorFlow, Keras and Optuna API of loops/private_apis.py, touched as the framework touches it: when
an upgrade moves one, its test fails with the guard's line naming it."""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from loops import private_apis
from tests.conftest import REPO


def test_the_pins_are_those_of_requirements_txt():
  pins = dict(re.findall(r"^([a-z_-]+)==([^\s#]+)", open(os.path.join(REPO, "requirements.txt")).read(), re.M))
  assert private_apis.PINNED == {library: pins[library] for library in private_apis.PINNED}


def test_a_missing_attribute_is_one_line_naming_the_api_and_both_versions(monkeypatch):
  monkeypatch.setitem(private_apis.PINNED, "keras", "0.0.1")
  monkeypatch.setattr(private_apis, "_WARNED", {"keras"})
  with pytest.raises(private_apis.PrivateApiMoved) as raised:
    private_apis.private(keras.layers.Dense, "_no_such_thing", "keras", "keras.layers.Dense._no_such_thing")
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"private API keras.layers.Dense._no_such_thing is missing from keras {keras.__version__} "
                            "(pinned: 0.0.1): install keras==0.0.1")


def test_a_missing_module_names_it():
  moved = r"private API keras\.src\.no_such_module is missing from keras"
  with pytest.raises(private_apis.PrivateApiMoved, match=moved):
    private_apis.private_module("keras.src.no_such_module", "keras")


def test_another_version_than_the_pinned_one_warns_once(monkeypatch, caplog):
  monkeypatch.setitem(private_apis.PINNED, "tensorflow", "0.0.1")
  monkeypatch.setattr(private_apis, "_WARNED", set())
  private_apis.op_determinism_enabled()
  private_apis.op_determinism_enabled()
  warned = [r.getMessage() for r in caplog.records if "is not the pinned" in r.getMessage()]
  assert warned == [f"tensorflow {tf.__version__} is not the pinned 0.0.1: the private APIs in loops/private_apis.py "
                    "are verified on 0.0.1 only"]


def nested_model():
  inner = keras.Sequential([keras.layers.Dense(3, name="inner_dense"), keras.layers.BatchNormalization()], name="inner")
  inputs = keras.Input((4,))
  return keras.Model(inputs, keras.layers.Dense(2, name="head")(inner(inputs)), name="outer")


def test_all_layers_reaches_nested_layers():
  model = nested_model()
  names = [layer.name for layer in private_apis.all_layers(model)]
  assert names[0] == "outer" and {"inner", "inner_dense", "head"} <= set(names)
  assert "outer" not in [layer.name for layer in private_apis.all_layers(model, include_self=False)]


def test_overrides_moments_tells_a_subclass_that_replaces_the_statistics():
  class OwnMoments(keras.layers.BatchNormalization):
    def _moments(self, inputs, mask):
      return super()._moments(inputs, mask)

  assert private_apis.overrides_moments(OwnMoments())
  assert not private_apis.overrides_moments(keras.layers.BatchNormalization())


def test_float32_pins_take_the_dtype_asked_and_nothing_else_changes():
  def pinned():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="body"),
                             keras.layers.Dense(2, dtype="float32", name="logits"),
                             keras.layers.Dense(2, dtype="mixed_bfloat16", name="mixed")])

  def dtypes(model):
    return {layer.name: (layer.kernel.dtype, layer.compute_dtype) for layer in model.layers}

  previous = keras.mixed_precision.dtype_policy()
  keras.mixed_precision.set_dtype_policy("float64")
  try:
    with private_apis.float32_pins_as("float64"):
      inside = dtypes(pinned())
    after = dtypes(pinned())
  finally:
    keras.mixed_precision.set_dtype_policy(previous)
  assert inside == {"body": ("float64", "float64"), "logits": ("float64", "float64"),
                    "mixed": ("float32", "bfloat16")}, inside
  assert after["logits"] == ("float32", "float32") and after["body"] == ("float64", "float64"), after


def test_compile_arguments_are_the_objects_given():
  model, auc = nested_model(), keras.metrics.AUC()
  model.compile(loss="mse", metrics=["accuracy", auc], weighted_metrics=["mae"], loss_weights=2.0)
  arguments = private_apis.compile_arguments(model)
  assert arguments["metrics"][1] is auc
  assert arguments["metrics"][0] == "accuracy" and arguments["weighted_metrics"] == ["mae"]


def test_keras_resolves_crossentropy_and_accuracy_by_the_shapes():
  labels, outputs = tf.constant([0, 2]), tf.zeros([2, 3])
  assert private_apis.resolve_loss("crossentropy", labels, outputs).fn is keras.losses.sparse_categorical_crossentropy
  one_hot = tf.one_hot(labels, 3)
  assert private_apis.resolve_loss("crossentropy", one_hot, outputs).fn is keras.losses.categorical_crossentropy
  assert isinstance(private_apis.resolve_metric("accuracy", labels, outputs), keras.metrics.SparseCategoricalAccuracy)


def test_the_replaced_gradient_sum_is_what_apply_gradients_calls():
  variable = keras.Variable(np.ones(2, np.float32))
  optimizer = keras.optimizers.SGD(1.0)
  assert callable(private_apis.gradient_sum(optimizer))
  calls = []

  def doubled(pairs):
    calls.append(len(pairs))
    return [(g * 2.0, v) for g, v in pairs]

  private_apis.replace_gradient_sum(optimizer, doubled)
  optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  assert calls == [1]
  np.testing.assert_allclose(variable.numpy(), [-1.0, -1.0])


def test_a_foreign_optimizer_has_no_gradient_sum():
  assert private_apis.gradient_sum(object()) is None


def test_moving_averages_and_built_variables_of_a_built_optimizer():
  variables = [keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(3, np.float32))]
  optimizer = keras.optimizers.Adam(use_ema=True)
  optimizer.build(variables)
  assert list(private_apis.built_variables(optimizer)) == variables
  assert [tuple(v.shape) for v in private_apis.moving_averages(optimizer)] == [(2,), (3,)]


class IdentityMap(dict):
  """A dict keyed by identity, as TensorFlow's object map (tf.Variable is unhashable)."""

  def __contains__(self, key):
    return super().__contains__(id(key))

  def __getitem__(self, key):
    return super().__getitem__(id(key))

  def __setitem__(self, key, value):
    super().__setitem__(id(key), value)


def test_keras_variables_map_to_their_wrapped_host_copy():
  private_apis.keras_variables_reuse_their_host_copy()
  variable, object_map = keras.Variable(np.ones(2, np.float32)), IdentityMap()
  variable._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access  (TensorFlow's async save does)
  assert object_map[variable] is object_map[variable.value]


def test_the_async_writer_and_its_error_check(tmp_path):
  checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
  assert private_apis.async_writer(checkpoint) is None
  checkpoint.save(str(tmp_path / "ckpt"), options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True))
  checkpoint.sync()
  writer = private_apis.async_writer(checkpoint)
  assert writer is private_apis.async_writer(checkpoint, create=True)
  private_apis.raise_async_write_error(writer)
  assert writer.checkpointer().save_counter is not None


def test_pending_restores_hold_what_waits_for_a_dependency(tmp_path):
  path = tf.train.Checkpoint(later=tf.Variable(3.0)).save(str(tmp_path / "ckpt"))
  restored = tf.train.Checkpoint()
  restored.restore(path)
  assert "later" in private_apis.pending_restores(restored)
  restored.later = tf.Variable(0.0)
  assert restored.later.numpy() == 3.0 and "later" not in private_apis.pending_restores(restored)


def test_op_determinism_is_read_and_turned_off():
  tf.config.experimental.enable_op_determinism()
  assert private_apis.op_determinism_enabled()
  private_apis.disable_op_determinism()
  assert not private_apis.op_determinism_enabled()


def test_deterministic_execution_also_turns_off_constant_folding_and_a_run_puts_both_back():
  """config.deterministic: Grappler's constant folding rewrote a ResNet-20 step differently from process to process
  (loops/build.py: deterministic_execution); a run leaves both as it found them (determinism_restored)."""
  from loops import build as build_lib  # pylint: disable=import-outside-toplevel
  private_apis.disable_op_determinism()
  with build_lib.determinism_restored():
    build_lib.deterministic_execution()
    assert private_apis.op_determinism_enabled()
    assert tf.config.optimizer.get_experimental_options()["constant_folding"] is False
  assert not private_apis.op_determinism_enabled()
  assert tf.config.optimizer.get_experimental_options().get("constant_folding", True) is True


@pytest.mark.parametrize("strategy_class", [tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy])
def test_next_collective_keys_sets_the_class_base(strategy_class, monkeypatch):
  monkeypatch.setattr(strategy_class, "_collective_key_base", strategy_class._collective_key_base)  # put back after
  private_apis.next_collective_keys(strategy_class, 123_456)
  assert strategy_class._collective_key_base == 123_456  # pylint: disable=protected-access


def test_slurm_host_and_task_lists_expand():
  assert private_apis.expand_hostlist("n[1-2],m7") == ["n1", "n2", "m7"]
  assert private_apis.expand_tasks_per_node("2(x2),1") == [2, 2, 1]


def test_gce_probes_exist():
  util = private_apis._failure_handling()  # pylint: disable=protected-access  (calling them probes the network)
  for name in ("on_gcp", "termination_watcher_function_gce"):
    assert callable(private_apis.private(util, name, "tensorflow"))


def test_a_trial_is_picked_up_again_by_its_storage_id():
  import optuna
  study = optuna.create_study()
  study.ask()
  frozen = study.get_trials(deepcopy=False)[0]
  trial = optuna.trial.Trial(study, private_apis.trial_id(frozen))
  trial.report(0.5, 1)
  assert study.get_trials(deepcopy=False)[0].intermediate_values == {1: 0.5}


def test_a_checkpoints_object_graph_parses(tmp_path):
  path = tf.train.Checkpoint(model=tf.Module()).save(str(tmp_path / "ckpt"))
  graph = private_apis.trackable_object_graph()
  graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  assert "model" in {child.local_name for child in graph.nodes[0].children}


def test_a_profiler_trace_message_is_made():
  xspace = private_apis.profiler_xspace()
  xspace.ParseFromString(xspace.SerializeToString())
  assert list(xspace.planes) == []


def _raises_on_a_positive(x):
  if x > 0:  # a tensor: AutoGraph converts the branch
    raise ValueError("a positive value")  # the line the error must name
  return x


def _calling(fn, x):
  return fn(x)


def test_an_error_in_converted_code_names_the_users_line():
  converted = tf.autograph.to_graph(_calling)  # as loops/task's user_call: AutoGraph converts what it calls
  with pytest.raises(ValueError) as raised:
    converted(_raises_on_a_positive, tf.constant(1.0))
  error = private_apis.autograph_user_error(raised.value)
  line = _raises_on_a_positive.__code__.co_firstlineno + 2
  assert str(error).splitlines()[0] == "in user code:" and f'test_private_apis.py", line {line}' in str(error)
  assert "a positive value" in str(error) and error.__suppress_context__
  plain = RuntimeError("not converted")
  assert private_apis.autograph_user_error(plain) is plain
