"""A model with named outputs: logits, an embedding and (optionally) a reconstruction of the input.

    python main.py --config=configs/digits_cnn.py --workdir=runs/embedding \
        --config.model.name=examples.models:cnn_with_embedding --config.model.kwargs.embedding_dim=16

Expected (2-core CPU, ~17 s with start-up): eval/accuracy >= 0.95 (measured 0.986), as the registry's digits_cnn. Eval metrics, the accuracy and
the export use outputs["logits"]; a loss declaring `outputs` gets the whole dict (see examples/losses.py).
"""

import keras
from keras import layers


def cnn_with_embedding(input_shape, num_classes, embedding_dim=32, reconstruct=False):
  """digits_cnn's trunk, an L2-free embedding of `embedding_dim` features, logits on top; with reconstruct=True
  also a decoder head "reconstruction" of the input's shape (for an auxiliary loss)."""
  inputs = keras.Input(input_shape)
  x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
  x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
  x = layers.MaxPooling2D(2)(x)
  embedding = layers.Dense(embedding_dim, activation="relu", name="embedding")(layers.Flatten()(x))
  outputs = {"logits": layers.Dense(num_classes, dtype="float32", name="logits")(embedding),
             "embedding": embedding}
  if reconstruct:
    pixels = layers.Dense(int(input_shape[0] * input_shape[1] * input_shape[2]), dtype="float32")(embedding)
    outputs["reconstruction"] = layers.Reshape(input_shape, name="reconstruction")(pixels)
  return keras.Model(inputs, outputs, name="cnn_with_embedding")
