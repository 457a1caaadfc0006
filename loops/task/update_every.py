"""Task.update_every: a model updated every k steps (WGAN-GP's critic steps before each generator step).

An optimizer's apply_gradients all-reduces through merge_call, which TensorFlow cannot compile inside control flow
of the replica function (tf.cond or `if` on a tensor, while, a nested tf.function) on several replicas; around
strategy.run, in the cross-replica context, it can. So the step is traced once per combination of models that
update on some step (`ctx.updates(name)` is a Python bool in each), and each step's variant is chosen in the
cross-replica context by tf.switch_case on the step counter (loops/distribute/steps.py: run_step).

A model listed with k updates on the steps where `step % k == k - 1` (k=5: 4, 9, 14, ...; step = the count before
the update); models not listed update every step.
"""

import itertools
import math

import tensorflow as tf

MAX_LISTED = 3  # at most 2**3 traced variants of the step
ENUMERATED_SPAN = 10_000  # up to this period of the whole pattern, variants no step reaches are not traced


def updates_at(step, period):
  """Whether a model updated every `period` steps updates at `step` (Python ints or tensors)."""
  return step % period == period - 1


def periods(update_every):
  """{name: k} of the models that skip some steps (k > 1), in name order; {} when every model updates every step."""
  return {name: update_every[name] for name in sorted(update_every) if update_every[name] > 1}


def span(update_every):
  """Steps after which the pattern of updates repeats: the least common multiple of the periods (1 for none)."""
  return math.lcm(*periods(update_every).values()) if periods(update_every) else 1


def reachable(update_every):
  """The combinations some step reaches, as tuples of bools (does each model of periods() update), sorted."""
  ks = list(periods(update_every).values())
  if span(update_every) > ENUMERATED_SPAN:
    return sorted(itertools.product((False, True), repeat=len(ks)))
  return sorted({tuple(updates_at(step, k) for k in ks) for step in range(span(update_every))})


class UpdateVariants:
  """A per-replica train step traced once per reachable combination of updating models: `steps[i]` is the step in
  which `updating[i]` ({trained model name: updates?}) holds; `index(step)` is a step's variant (an int32 tensor)."""

  def __init__(self, periods_by_name, updating, steps, branch_of_code):
    self.periods, self.updating, self.steps = periods_by_name, updating, steps
    self._branch_of_code = branch_of_code  # [2**len(periods)]: the variant of each bit pattern of updating models

  def index(self, step):
    """The variant of `step` (the step counter before the update): tf.switch_case's branch index."""
    code = tf.add_n([tf.cast(updates_at(step, tf.cast(k, step.dtype)), tf.int32) * (1 << i)
                     for i, k in enumerate(self.periods.values())])
    return tf.gather(tf.constant(self._branch_of_code, tf.int32), code)

  def map(self, wrap):
    """The same variants with each step wrapped (wrap(step) -> another per-replica function)."""
    return UpdateVariants(self.periods, self.updating, [wrap(step) for step in self.steps], self._branch_of_code)


def variants_or_step(update_every, trained, make_step):
  """make_step(updating) -> a per-replica step in which {trained model name: updates?} holds. Returns the one step
  in which every model updates (traced as without update_every) when no model skips a step, else UpdateVariants
  with one step per combination some step reaches."""
  listed = periods(update_every)
  if not listed:
    return make_step({name: True for name in trained})
  combinations = reachable(update_every)
  updating = [{name: dict(zip(listed, combination)).get(name, True) for name in trained}
              for combination in combinations]
  branch = {sum(bit << i for i, bit in enumerate(combination)): b for b, combination in enumerate(combinations)}
  return UpdateVariants(listed, updating, [make_step(u) for u in updating],
                        [branch.get(code, 0) for code in range(2 ** len(listed))])


def each_step(step_fn, wrap):
  """wrap(step_fn), or the UpdateVariants with each variant wrapped."""
  return step_fn.map(wrap) if isinstance(step_fn, UpdateVariants) else wrap(step_fn)
