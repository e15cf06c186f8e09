"""A tiny CNN for fast tests whose variables fall in every size category.

| variable      | shape          | bytes (float32) | category |
|---------------|----------------|-----------------|----------|
| conv1 kernel  | 3x3x3x8        | 864             | Small    |
| conv1 bias    | 8              | 32              | Small    |
| conv2 kernel  | 3x3x8x16       | 4,608           | Medium   |
| conv2 bias    | 16             | 64              | Small    |
| hidden kernel | 16x1024        | 65,536          | Medium   |
| hidden bias   | 1024           | 4,096           | Medium   |
| wide kernel   | 1024x512       | 2,097,152       | Large    |
| wide bias     | 512            | 2,048           | Medium   |
| logits kernel | 512xclasses    | 20,480 (10)     | Medium   |
| logits bias   | classes        | 40 (10)         | Small    |

548,730 parameters with 10 classes.  Global average pooling makes the
variables independent of the input size; no batch normalisation, so only
trainable variables cross the wire.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def build_tiny(keras: ModuleType, *, input_shape: tuple[int, int, int], classes: int) -> Any:
    """The tiny model for ``input_shape`` (height, width, 3) >= 8x8, outputting logits."""
    layers = keras.layers
    images = keras.Input(shape=input_shape, name="images")
    x = layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(images)
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv2")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(1024, activation="relu", name="hidden")(x)
    x = layers.Dense(512, activation="relu", name="wide")(x)
    logits = layers.Dense(classes, name="logits")(x)
    return keras.Model(images, logits, name="tiny")
