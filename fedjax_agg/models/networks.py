"""The networks of the five papers as flax modules (NHWC inputs).

Every convolution is ``layers.Conv`` (and every pooling ``layers.max_pool``)
so that its lowering (``conv_impl``) can be chosen for speed when clients
are vmapped; parameter names and initialisers are those of
``flax.linen.Conv``. Layers are named explicitly
(``conv1``, ``fc1``, ...) so that the per-layer rules see stable names.
"""

from typing import Sequence

import flax.linen as nn

from fedjax_agg.models import layers

__all__ = ["FedNNNNCifarCNN", "MLP2", "TFTutorialCNN", "TwoConvCNN", "VGG11",
    "VGG11_CONFIG"]


def _pool(x):
  # 2x2 stride-2 max pool; layers.max_pool has a fast gradient on CPU.
  return layers.max_pool(x, (2, 2))


def _flatten(x):
  # NHWC flattened row-major: fc1 reads features in (h, w, c) order, not
  # PyTorch's (c, h, w); weights ported from NCHW would need permuting.
  return x.reshape((x.shape[0], -1))


class TwoConvCNN(nn.Module):
  """conv5x5 -> ReLU -> pool -> conv5x5 -> ReLU -> pool -> fc -> ReLU -> fc.

  One template for three papers' networks (see ``fedjax_agg.models``):
  FedAvg's CNN (32, 64, 512, SAME), FedLayerWise's (32, 64, 512, VALID) and
  FedNNNN's MNIST CNN (20, 50, 500, VALID).
  """
  num_classes: int
  features: tuple[int, int] = (32, 64)
  hidden: int = 512
  padding: str = "SAME"
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # No dropout or normalisation.
    for i, features in enumerate(self.features):
      x = layers.Conv(features, (5, 5), padding=self.padding,
                      impl=self.conv_impl, name=f"conv{i + 1}")(x)
      x = _pool(nn.relu(x))
    x = nn.relu(nn.Dense(self.hidden, name="fc1")(_flatten(x)))
    return nn.Dense(self.num_classes, name="fc2")(x)


class MLP2(nn.Module):
  """FedLap's two-layer network: flatten -> fc(hidden) -> ReLU -> fc.

  ``batch_norm=True`` adds a BatchNorm layer ("bn1") after fc1 (for FedBN
  on the MNIST-shaped data sets).
  """
  num_classes: int
  hidden: int = 200
  batch_norm: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(self.hidden, name="fc1")(_flatten(x))
    if self.batch_norm:
      x = _batch_norm(train, "bn1")(x)
    x = nn.relu(x)
    return nn.Dense(self.num_classes, name="fc2")(x)


class TFTutorialCNN(nn.Module):
  """The TensorFlow tutorial CIFAR-10 CNN used by FedLap.

  conv3x3·32 -> pool -> conv3x3·64 -> pool -> conv3x3·64 -> fc 64 -> fc,
  VALID padding, ReLU everywhere: 122,570 parameters for 10 classes.
  """
  num_classes: int
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    for i, features in enumerate((32, 64, 64)):
      x = layers.Conv(features, (3, 3), padding="VALID", impl=self.conv_impl,
                      name=f"conv{i + 1}")(x)
      x = nn.relu(x)
      if i < 2:
        x = _pool(x)
    x = nn.relu(nn.Dense(64, name="fc1")(_flatten(x)))
    return nn.Dense(self.num_classes, name="fc2")(x)


def _batch_norm(train: bool, name: str):
  # PyTorch's BatchNorm2d defaults (running-average momentum 0.1, eps 1e-5);
  # flax's momentum is the weight of the old running average.
  return nn.BatchNorm(use_running_average=not train, momentum=0.9,
                      epsilon=1e-5, name=name)


class FedNNNNCifarCNN(nn.Module):
  """FedNNNN Table 4: six 3x3 convs with BatchNorm, then fc 382-192-C.

  Blocks of two (conv3x3 -> BN -> ReLU) with 32, 64, 128 channels, SAME
  padding, each block followed by a 2x2 max pool; the convs have biases (as
  the paper states for all its layers).
  """
  num_classes: int
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    for block, features in enumerate((32, 64, 128)):
      for j in range(2):
        name = f"conv{block + 1}{j + 1}"
        x = layers.Conv(features, (3, 3), padding="SAME",
                        impl=self.conv_impl, name=name)(x)
        x = nn.relu(_batch_norm(train, f"bn{block + 1}{j + 1}")(x))
      x = _pool(x)
    x = nn.relu(nn.Dense(382, name="fc1")(_flatten(x)))
    x = nn.relu(nn.Dense(192, name="fc2")(x))
    return nn.Dense(self.num_classes, name="fc3")(x)


VGG11_CONFIG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512,
                "M")
"""VGG-11's feature layers (configuration A): an int is a 3x3 SAME conv with
that many output channels, "M" a 2x2 stride-2 max pool."""


class VGG11(nn.Module):
  """VGG-11 (Simonyan & Zisserman, configuration A) for 32x32 inputs.

  Eight 3x3 SAME convs with ReLU and five max pools leave a 1x1x512 map;
  the classifier is fc 512 -> ReLU -> fc 512 -> ReLU -> fc C, the CIFAR
  variant used by the FedNova/FedDRL line of work. Dropout of that
  classifier is left out (the model contract's
  ``fedjax_agg.types.Model.apply`` takes no random key).
  ``batch_norm=True`` adds BatchNorm after every conv (VGG-11-BN).
  """
  num_classes: int
  batch_norm: bool = False
  config: Sequence = VGG11_CONFIG
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    conv_index = 0
    for item in self.config:
      if item == "M":
        x = _pool(x)
        continue
      conv_index += 1
      x = layers.Conv(int(item), (3, 3), padding="SAME", impl=self.conv_impl,
                      name=f"conv{conv_index}")(x)
      if self.batch_norm:
        x = _batch_norm(train, f"bn{conv_index}")(x)
      x = nn.relu(x)
    x = _flatten(x)
    x = nn.relu(nn.Dense(512, name="fc1")(x))
    x = nn.relu(nn.Dense(512, name="fc2")(x))
    return nn.Dense(self.num_classes, name="fc3")(x)
