"""AlexNet (Krizhevsky, Sutskever and Hinton, NIPS 2012), single tower.

Keras has no AlexNet.  This is the single-tower variant that TensorFlow's
benchmarks train (tf_cnn_benchmarks' ``alexnet``): five ReLU convolutions with
biases, 64 11x11/4 (valid), 192 5x5, 384 3x3, 384 3x3, 256 3x3 (same), with
3x3/2 max pooling (valid) after the first, second and fifth, then fully
connected 4096, 4096 with dropout 0.5, and the classifier.  No local response
normalisation, as in that benchmark.  The full-size input is 227x227 (224 plus
the 3 pixels that valid padding needs), where the last feature map is 6x6x256;
smaller inputs are resized to that map before flattening (see
``heads.full_size_feature_map``).  61,838,248 parameters with 1000 classes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tf_grpc_bench.models.heads import full_size_feature_map


def build_alexnet(keras: ModuleType, *, input_shape: tuple[int, int, int], classes: int) -> Any:
    """AlexNet for ``input_shape`` (height, width, 3) >= 67x67, outputting logits."""
    layers = keras.layers
    images = keras.Input(shape=input_shape, name="images")
    x = layers.Conv2D(64, 11, strides=4, padding="valid", activation="relu", name="conv1")(images)
    x = layers.MaxPooling2D(3, strides=2, padding="valid", name="pool1")(x)
    x = layers.Conv2D(192, 5, padding="same", activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(3, strides=2, padding="valid", name="pool2")(x)
    x = layers.Conv2D(384, 3, padding="same", activation="relu", name="conv3")(x)
    x = layers.Conv2D(384, 3, padding="same", activation="relu", name="conv4")(x)
    x = layers.Conv2D(256, 3, padding="same", activation="relu", name="conv5")(x)
    x = layers.MaxPooling2D(3, strides=2, padding="valid", name="pool5")(x)
    x = full_size_feature_map(keras, x, side=6)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(4096, activation="relu", name="fc6")(x)
    x = layers.Dropout(0.5, name="drop6")(x)
    x = layers.Dense(4096, activation="relu", name="fc7")(x)
    x = layers.Dropout(0.5, name="drop7")(x)
    logits = layers.Dense(classes, name="fc8")(x)
    return keras.Model(images, logits, name="alexnet")
