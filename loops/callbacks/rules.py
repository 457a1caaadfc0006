"""The callbacks' rules: the config's names import as factories (`check_names`, before anything is built), and
what the factories made has the hooks, each taking the loop's state (`check_callbacks`)."""

from errors import ConfigError
from loops.core import plugins
from loops.core.interfaces import HOOKS


def check_names(names):
  """config.callbacks: a tuple of 'package.module:factory' strings, each importable and callable with the config."""
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise ConfigError(f"callbacks must be a tuple of 'package.module:factory' strings, got {names!r}")
  for name in names:
    plugins.load_callable(name, "callbacks", 1)


def check_callbacks(named):
  """Every callback has some of the hooks, each a method taking one argument (the State).

  Args:
    named: [(name, callback)] as loops.callbacks.load_user makes them.
  """
  for name, callback in named:
    hooks = [hook for hook in HOOKS if hasattr(callback, hook)]
    if not hooks:
      raise ConfigError(f"callback '{name}' ({type(callback).__name__}) has none of the methods {', '.join(HOOKS)}")
    for hook in hooks:
      method = getattr(callback, hook)
      if not callable(method) or not plugins.accepts(method, 1):
        raise ConfigError(f"callback '{name}': {hook} must be a method taking one argument (state)")
    _check_checkpointed(name, getattr(callback, "checkpointed", None))


def _check_checkpointed(name, state):
  """`checkpointed`: None, a tf.Module, or a dict whose every value is a tf.Variable (a plain number would not be
  saved, and would come back as it started after a resume)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if state is None or isinstance(state, tf.Module):
    return
  if not isinstance(state, dict):
    raise ConfigError(f"callback '{name}': checkpointed must be a tf.Module or a dict of tf.Variables, got "
                      f"{type(state).__name__}")
  for key, value in state.items():
    if not isinstance(value, tf.Variable):
      raise ConfigError(f"callback '{name}': checkpointed[{key!r}] is a {type(value).__name__}, which a checkpoint "
                        f"does not save: make it a tf.Variable (e.g. tf.Variable({value!r}))")
