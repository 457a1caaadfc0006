"""mixup (Zhang et al. 2018) and cutmix (Yun et al. 2019) on a whole GLOBAL batch, keyed per batch.

Each example is mixed with a partner from the same global batch (a keyed permutation) by a share lambda ~
Beta(alpha, alpha) drawn once per batch (cutmix: a box of area (1 - lambda) pasted from the partner; lambda is then
the exact uncovered fraction). Labels become soft: lambda * one_hot(own) + (1 - lambda) * one_hot(partner).
Everything is a function of (seed, batch key), so resume is exact and any split of the batch sees the same mixes.
"""

import tensorflow as tf

_SALT_PARTNER, _SALT_CHOICE, _SALT_BETA_A, _SALT_BETA_B, _SALT_BOX = range(1, 6)


def mixes(data_settings):
  return bool(data_settings.mixup_alpha or data_settings.cutmix_alpha)


def make_mix(num_classes, mixup_alpha, cutmix_alpha, seed):
  """fn(images, labels, key) -> (mixed float32 images, soft labels [batch, num_classes]); None when both are off."""
  mix_pairs = make_pair_mix(num_classes, mixup_alpha, cutmix_alpha, seed)
  if mix_pairs is None:
    return None

  @tf.autograph.experimental.do_not_convert
  def mix(images, labels, key):
    partner = partners(seed, key, tf.shape(images)[0])
    return mix_pairs(images, labels, tf.gather(images, partner), tf.gather(labels, partner), key)

  return mix


@tf.autograph.experimental.do_not_convert
def partners(seed, key, size):
  """The partner of each of a batch's `size` rows (a permutation keyed on (seed, key))."""
  return tf.random.experimental.stateless_shuffle(tf.range(size), seed=_seed(seed, _SALT_PARTNER, key))


def make_pair_mix(num_classes, mixup_alpha, cutmix_alpha, seed):
  """fn(images, labels, partner_images, partner_labels, key) -> (mixed images, soft labels): rows mixed with their
  partners (any subset of a batch's rows, given their partners, mixes exactly as in the whole batch), by
  data.mixup_alpha and data.cutmix_alpha; None when both are off."""
  if not (mixup_alpha or cutmix_alpha):
    return None
  mixup_alpha, cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)

  @tf.autograph.experimental.do_not_convert
  def mix_pairs(images, labels, other_images, other_labels, key):
    def seed_of(salt):
      return _seed(seed, salt, key)

    soft = tf.one_hot(tf.cast(labels, tf.int32), num_classes, dtype=tf.float32)
    other_soft = tf.one_hot(tf.cast(other_labels, tf.int32), num_classes, dtype=tf.float32)
    if mixup_alpha and cutmix_alpha:
      use_cutmix = tf.random.stateless_uniform([], seed=seed_of(_SALT_CHOICE)) < 0.5
      images, share = tf.cond(use_cutmix, lambda: _cutmix(images, other_images, cutmix_alpha, seed_of),
                              lambda: _mixup(images, other_images, mixup_alpha, seed_of))
    elif mixup_alpha:
      images, share = _mixup(images, other_images, mixup_alpha, seed_of)
    else:
      images, share = _cutmix(images, other_images, cutmix_alpha, seed_of)
    return images, share * soft + (1.0 - share) * other_soft

  return mix_pairs


@tf.autograph.experimental.do_not_convert
def _seed(seed, salt, key):
  return tf.stack([tf.constant(seed * 16 + salt, tf.int64), tf.cast(key, tf.int64)])


@tf.autograph.experimental.do_not_convert
def _beta(alpha, seed_of):
  a = tf.random.stateless_gamma([], seed=seed_of(_SALT_BETA_A), alpha=alpha)
  b = tf.random.stateless_gamma([], seed=seed_of(_SALT_BETA_B), alpha=alpha)
  return a / (a + b)


@tf.autograph.experimental.do_not_convert
def _mixup(images, other, alpha, seed_of):
  share = _beta(alpha, seed_of)
  return share * images + (1.0 - share) * other, share


@tf.autograph.experimental.do_not_convert
def _cutmix(images, other, alpha, seed_of):
  """One box per batch, its area (1 - lambda) of the image, centred uniformly and clipped at the borders."""
  height, width = tf.shape(images)[1], tf.shape(images)[2]
  cut = tf.sqrt(1.0 - _beta(alpha, seed_of))
  box_h = tf.cast(tf.round(cut * tf.cast(height, tf.float32)), tf.int32)
  box_w = tf.cast(tf.round(cut * tf.cast(width, tf.float32)), tf.int32)
  centre = tf.random.stateless_uniform([2], seed=seed_of(_SALT_BOX), minval=0, maxval=tf.int32.max, dtype=tf.int32)
  cy, cx = centre[0] % height, centre[1] % width
  y0, y1 = tf.clip_by_value(cy - box_h // 2, 0, height), tf.clip_by_value(cy + box_h - box_h // 2, 0, height)
  x0, x1 = tf.clip_by_value(cx - box_w // 2, 0, width), tf.clip_by_value(cx + box_w - box_w // 2, 0, width)
  rows, columns = tf.range(height), tf.range(width)
  inside = (((rows >= y0) & (rows < y1))[:, None] & ((columns >= x0) & (columns < x1))[None, :])
  box = tf.cast(inside, images.dtype)[None, :, :, None]  # 0/1 weights: exact, and cheaper than a broadcast select
  mixed = box * other + (1.0 - box) * images
  # In float64, rounded once to float32: a division by a constant is strength-reduced to a multiplication by its
  # reciprocal in one graph and not in another (tf.data vs a tf.function): in float32 the two differed by 1 ulp.
  uncovered = tf.cast(height * width - (y1 - y0) * (x1 - x0), tf.float64) / tf.cast(height * width, tf.float64)
  share = tf.cast(uncovered, tf.float32)
  return mixed, share
