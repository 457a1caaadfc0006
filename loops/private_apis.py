"""Every private TensorFlow, Keras and Optuna API the framework uses, one function each, grouped by concern.

Each access goes through `private` or `private_module`: when the attribute or module is missing, the run stops with
one line naming the API, the installed version and the pinned one (requirements.txt); when the installed version
is not the pinned one, the first access logs one warning line. tests/test_private_apis.py touches each as the
code does; WORKSPACE.md's "Private APIs and their guards" lists why no public API serves. Importing it imports no
TensorFlow or Keras (loops/distribute/cluster.py and others stay light); each function imports what it touches.
"""

import contextlib
import importlib

from absl import logging

# As pinned in requirements.txt (tests/test_private_apis.py checks they agree).
PINNED = {"tensorflow": "2.21.0", "keras": "3.15.1", "optuna": "5.0.0"}
_WARNED = set()


class PrivateApiMoved(RuntimeError):
  """A private API this framework relies on is not where the pinned version keeps it."""


def installed_version(library):
  """The installed version of `library` (its __version__)."""
  return importlib.import_module(library).__version__


def moved(api, library):
  """PrivateApiMoved naming `api`, the installed and the pinned version of `library`."""
  return PrivateApiMoved(f"private API {api} is missing from {library} {installed_version(library)} (pinned: "
                         f"{PINNED[library]}): install {library}=={PINNED[library]} or update loops/private_apis.py")


def _warn_if_unpinned(library):
  installed = installed_version(library)
  if installed != PINNED[library] and library not in _WARNED:
    _WARNED.add(library)
    logging.warning("%s %s is not the pinned %s: the private APIs in loops/private_apis.py are verified on %s only",
                    library, installed, PINNED[library], PINNED[library])


def private(owner, name, library, api=None):
  """getattr(owner, name); PrivateApiMoved naming the API when it is missing."""
  _warn_if_unpinned(library)
  try:
    return getattr(owner, name)
  except AttributeError:
    raise moved(api or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}", library) from None


def private_module(path, library):
  """The private module `path`; PrivateApiMoved naming it when it cannot be imported."""
  _warn_if_unpinned(library)
  try:
    return importlib.import_module(path)
  except ImportError:
    raise moved(path, library) from None


# --- Keras layers: walking nested layers, BatchNormalization's moments.

def all_layers(model, include_self=True):
  """Every layer of `model`, nested ones too (Keras' `layers` lists only the direct children)."""
  flatten = private(model, "_flatten_layers", "keras", "keras.layers.Layer._flatten_layers")
  return list(flatten(include_self=include_self))


def overrides_moments(layer):
  """True when `layer`'s class replaces BatchNormalization's `_moments` (the statistics the fused kernel assumes)."""
  import keras  # pylint: disable=import-outside-toplevel
  method = lambda cls: private(cls, "_moments", "keras", "keras.layers.BatchNormalization._moments")
  return method(type(layer)) is not method(keras.layers.BatchNormalization)


# --- Keras dtype policies: the check's float64 build of a model that pins a layer to float32.

@contextlib.contextmanager
def float32_pins_as(dtype):
  """Keras layers built inside that pin their dtype to float32 (a logits layer, as Keras' mixed-precision guide
  teaches) take `dtype` instead; every other policy, and the global one, as they are."""
  policies = private_module("keras.src.dtype_policies", "keras")
  get = private(policies, "get", "keras", "keras.src.dtype_policies.get")

  def pinned_as_dtype(identifier):
    policy = get(identifier)
    return get(dtype) if identifier is not None and policy.name == "float32" else policy

  policies.get = pinned_as_dtype
  try:
    yield
  finally:
    policies.get = get


# --- Keras compile(): the arguments as given, and Keras' resolution of "crossentropy"/"accuracy" by shapes.

def compile_arguments(model):
  """compile()'s arguments as given (metric objects themselves; get_compile_config() serializes them)."""
  config = private(model, "_compile_config", "keras", "keras.Model._compile_config")
  return private(config, "config", "keras", "keras.Model._compile_config.config")


def _compile_utils():
  return private_module("keras.src.trainers.compile_utils", "keras")


def resolve_loss(identifier, labels, outputs):
  """The keras Loss compile() would make of `identifier` for these labels and outputs."""
  return private(_compile_utils(), "get_loss", "keras")(identifier, labels, outputs)


def resolve_metric(identifier, labels, outputs):
  """The keras Metric compile() would make of `identifier` for these labels and outputs."""
  return private(_compile_utils(), "get_metric", "keras")(identifier, labels, outputs)


# --- Keras optimizers: the cross-replica gradient sum, the EMA weights, the variables it was built for.

def gradient_sum(optimizer):
  """The optimizer's cross-replica gradient sum (pairs -> pairs), or None for an optimizer that is not Keras'."""
  import keras  # pylint: disable=import-outside-toplevel
  if not isinstance(optimizer, keras.optimizers.Optimizer):
    return getattr(optimizer, "_all_reduce_sum_gradients", None)
  return private(optimizer, "_all_reduce_sum_gradients", "keras",
                 "keras.optimizers.Optimizer._all_reduce_sum_gradients")


def replace_gradient_sum(optimizer, fn):
  """Makes apply_gradients call fn(pairs) where Keras sums the replicas' gradients."""
  gradient_sum(optimizer)  # the attribute must exist, or apply_gradients would never call fn
  optimizer._all_reduce_sum_gradients = fn  # pylint: disable=protected-access


def moving_averages(optimizer):
  """The built optimizer's exponential moving averages of the trainable weights (use_ema=True)."""
  return private(optimizer, "_model_variables_moving_average", "keras",
                 "keras.optimizers.Optimizer._model_variables_moving_average")


def built_variables(optimizer):
  """The variables the optimizer was built for, in the order of its slot lists."""
  return private(optimizer, "_trainable_variables", "keras", "keras.optimizers.Optimizer._trainable_variables")


# --- Keras variables under TensorFlow's asynchronous checkpoint.

def keras_variables_reuse_their_host_copy():
  """Keras 3's Variable._copy_trackable_to_cpu makes a new tf.Variable on every call, which TensorFlow's
  asynchronous save calls inside a tf.function from the second save on ("tf.function only supports singleton
  tf.Variables"); replaced (process-wide, idempotent) by one that maps to the wrapped tf.Variable's host copy."""
  core = private_module("keras.src.backend.tensorflow.core", "keras")
  variable = private(core, "Variable", "keras", "keras.src.backend.tensorflow.core.Variable")
  private(variable, "_copy_trackable_to_cpu", "keras", "keras Variable._copy_trackable_to_cpu")

  def copy_trackable_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    if self not in object_map:
      object_map[self] = object_map[self.value]

  variable._copy_trackable_to_cpu = copy_trackable_to_cpu  # pylint: disable=protected-access


# --- tf.train.Checkpoint: its asynchronous writer, and values waiting for dependencies not attached yet.

def async_writer(checkpoint, create=False):
  """The checkpoint's asynchronous writer (made when `create`), or None before its first asynchronous save."""
  if create:
    return private(checkpoint, "_async_checkpointer", "tensorflow", "tf.train.Checkpoint._async_checkpointer")()
  return private(checkpoint, "_async_checkpointer_impl", "tensorflow", "tf.train.Checkpoint._async_checkpointer_impl")


def raise_async_write_error(writer):
  """Raises the error of a failed asynchronous write, if there was one."""
  private(writer, "_check_async_thread_error", "tensorflow", "AsyncCheckpointHelper._check_async_thread_error")()


def pending_restores(trackable):
  """TensorFlow's {name: [restore positions]} a trackable keeps for dependencies not attached yet."""
  private(trackable, "_maybe_initialize_trackable", "tensorflow", "Trackable._maybe_initialize_trackable")()
  return private(trackable, "_deferred_dependencies", "tensorflow", "Trackable._deferred_dependencies")


# --- Op determinism (process-wide; TensorFlow exports only the setter).

def _framework_config():
  return private_module("tensorflow.python.framework.config", "tensorflow")


def op_determinism_enabled():
  return private(_framework_config(), "is_op_determinism_enabled", "tensorflow")()


def disable_op_determinism():
  private(_framework_config(), "disable_op_determinism", "tensorflow")()


# --- tf.distribute: collective keys, SLURM's host lists, GCE's maintenance notices.

def next_collective_keys(strategy_class, base):
  """Makes the next `strategy_class` (Mirrored or MultiWorkerMirrored) start its collective keys at `base`."""
  private(strategy_class, "_collective_key_base", "tensorflow",
          f"tf.distribute.{strategy_class.__name__}._collective_key_base")
  strategy_class._collective_key_base = base  # pylint: disable=protected-access


def _slurm():
  return private_module("tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver", "tensorflow")


def expand_hostlist(nodelist):
  """'n[1-2]' -> ['n1', 'n2'] (SLURM_STEP_NODELIST)."""
  return private(_slurm(), "expand_hostlist", "tensorflow")(nodelist)


def expand_tasks_per_node(tasks):
  """'2(x2)' -> [2, 2] (SLURM_STEP_TASKS_PER_NODE)."""
  return private(_slurm(), "expand_tasks_per_node", "tensorflow")(tasks)


def _failure_handling():
  return private_module("tensorflow.python.distribute.failure_handling.failure_handling_util", "tensorflow")


def on_gce():
  """True on a Google Compute Engine VM (an HTTP probe, up to 5 s)."""
  return private(_failure_handling(), "on_gcp", "tensorflow")()


def gce_maintenance_notice():
  """True when GCE announces a maintenance event for this VM."""
  return private(_failure_handling(), "termination_watcher_function_gce", "tensorflow")()


# --- Optuna: a running trial of a study, picked up again by number.

def trial_id(frozen_trial):
  """The storage id optuna.trial.Trial(study, id) takes (FrozenTrial exports the number only)."""
  return private(frozen_trial, "_trial_id", "optuna", "optuna.trial.FrozenTrial._trial_id")


# --- AutoGraph: an error raised in converted code, as a tf.function raises it.

def autograph_user_error(error):
  """`error` as tf.function raises an error of code AutoGraph converted ("in user code:", each frame mapped to the
  user's source line); `error` itself when it carries no AutoGraph metadata."""
  metadata = getattr(error, "ag_error_metadata", None)
  if metadata is None:
    return error
  return private(metadata, "to_exception", "tensorflow", "AutoGraph's error metadata .to_exception")(error)


# --- Protocol-buffer schemas TensorFlow does not export: a checkpoint's object graph, a profiler trace.

def trackable_object_graph():
  """A new, empty TrackableObjectGraph message (what a checkpoint's _CHECKPOINTABLE_OBJECT_GRAPH tensor holds)."""
  protos = private_module("tensorflow.core.protobuf.trackable_object_graph_pb2", "tensorflow")
  return private(protos, "TrackableObjectGraph", "tensorflow")()


def profiler_xspace():
  """A new, empty XSpace message (what a profiler trace's *.xplane.pb holds)."""
  protos = private_module("tensorflow.tsl.profiler.protobuf.xplane_pb2", "tensorflow")
  return private(protos, "XSpace", "tensorflow")()
