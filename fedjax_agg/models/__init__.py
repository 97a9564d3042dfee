"""The papers' networks behind the ``Model`` contract (init/apply pairs).

``get(name, num_classes, ...)`` builds one of:

================= =================================================== =========
name              network (paper)                                        params
================= =================================================== =========
cnn_mcmahan       conv5x5·32, pool, conv5x5·64, pool, fc 512, fc 10,  1,663,370
                  SAME (FedAvg's CNN; FedDRL on (F)MNIST)
cnn_fedlayerwise  the same with VALID padding (FedLayerWise §IV-A)      582,026
cnn_fednnnn_mnist conv5x5·20, pool, conv5x5·50, pool, fc 500, fc 10,    431,080
                  VALID (FedNNNN Table 3)
cnn_fednnnn_cifar six conv3x3 32-32-64-64-128-128 with BN, fc         1,146,088
                  382-192-10 (FedNNNN Table 4; +896 BN statistics)
mlp2              flatten, fc 200, ReLU, fc 10 (FedLap, (F)MNIST)       159,010
cnn_tf_cifar      TensorFlow-tutorial CIFAR-10 CNN (FedLap)             122,570
vgg11             VGG-11, classifier 512-512-100 (FedDRL, CIFAR-100)  9,797,092
char_lstm         embed 8, LSTM 256, LSTM 256, softmax (FedAvg/LEAF     817,872
                  Shakespeare; 80 characters)
word_lstm         embed 96, LSTM 670, fc 96, softmax (Reddi et al.    4,050,748
                  2021 Stack Overflow; 10,004 words)
transformer_lm    causal transformer: width 128, depth 2, 4 heads,      427,600
                  80 positions (80 characters)
================= =================================================== =========

(Counts are trainable parameters for the default input shape and 10
classes, 100 for vgg11, the vocabulary shown for the language models.)

Language models (``SEQUENCE_MODELS``) read int32 tokens [B, T] and return
logits [B, T, V]; their ``Model.loss`` is ``types.sequence_cross_entropy``
(the mean over each example's real tokens; padded targets are
``types.PAD_TARGET``), and ``num_classes`` is the vocabulary. See
``fedjax_agg.models.sequence``.

LoRA adapters on any of them (a frozen base, trainable low-rank adapters;
Hu et al., ICLR 2022): ``fedjax_agg.models.lora``. Pre-trained language
models (GPT-2, Llama, Mistral, Qwen2) from local Hugging Face checkpoint
folders, and their adapters saved in PEFT's format:
``fedjax_agg.models.pretrained``. Mixed precision for
local training (bfloat16 products on float32 master weights):
``fedjax_agg.models.mixed``.

Contract (``fedjax_agg.types.Model``), written for one client:
``init(key) -> variables`` (``{'params': ...}`` plus ``'batch_stats'`` for
the BatchNorm networks) and ``apply(variables, x, train) -> (logits,
new_variables)``; the engine adds the client axis with ``jax.vmap``.

BatchNorm. With ``train=True`` a BatchNorm layer normalises with the
statistics of the client's batch and ``new_variables['batch_stats']`` holds
the updated running averages; with ``train=False`` the running averages are
used and the variables come back unchanged. The statistics are client state
during local training and are aggregated together with the parameters (the
server rule sees them as ordinary leaves; their gradient is zero). FedBN
(``fedjax_agg.clients.fedbn``) keeps them, and the BatchNorm scale and
bias, per client instead.
"""

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg.models import layers
from fedjax_agg.models import networks
from fedjax_agg.models import sequence
from fedjax_agg.registry import Registry
from fedjax_agg.types import Model
from fedjax_agg.types import sequence_cross_entropy

__all__ = ["NAMES", "PRETRAINED", "REGISTRY", "SEQUENCE_MODELS",
           "check_option", "check_options", "count_params",
           "default_input_shape", "get", "module"]

_MNIST_SHAPE = (28, 28, 1)
_CIFAR_SHAPE = (32, 32, 3)

# name -> (module constructor taking num_classes and options, default input
# shape). ``conv_impl`` is passed to every module that has convolutions.
_BUILDERS: dict[str, tuple[Callable[..., nn.Module], tuple[int, ...]]] = {
    "cnn_mcmahan": (functools.partial(
        networks.TwoConvCNN, features=(32, 64), hidden=512, padding="SAME"),
                    _MNIST_SHAPE),
    "cnn_fedlayerwise": (functools.partial(
        networks.TwoConvCNN, features=(32, 64), hidden=512, padding="VALID"),
                         _MNIST_SHAPE),
    "cnn_fednnnn_mnist": (functools.partial(
        networks.TwoConvCNN, features=(20, 50), hidden=500, padding="VALID"),
                          _MNIST_SHAPE),
    "cnn_fednnnn_cifar": (networks.FedNNNNCifarCNN, _CIFAR_SHAPE),
    "mlp2": (networks.MLP2, _MNIST_SHAPE),
    "cnn_tf_cifar": (networks.TFTutorialCNN, _CIFAR_SHAPE),
    "vgg11": (networks.VGG11, _CIFAR_SHAPE),
    "char_lstm": (sequence.CharLSTM, (80,)),
    "word_lstm": (sequence.WordLSTM, (20,)),
    "transformer_lm": (sequence.TransformerLM, (80,)),
}
# Options a caller may set through ``get(**kwargs)``.
_OPTIONS = {"mlp2": ("hidden", "batch_norm"), "vgg11": ("batch_norm",),
            "char_lstm": ("embed_dim", "hidden", "num_layers", "projection"),
            "word_lstm": ("embed_dim", "hidden", "num_layers", "projection"),
            "transformer_lm": ("width", "depth", "heads", "max_length")}
NAMES = tuple(_BUILDERS)
"""The names of the registered networks."""
SEQUENCE_MODELS = ("char_lstm", "word_lstm", "transformer_lm")
"""The language models: int32 tokens [T] in, per-position logits out."""
PRETRAINED = "pretrained"
"""A description's ``model.name`` for the network of a downloaded
checkpoint: the Hugging Face folder ``model.base`` (``config.json`` and
safetensors, ``models.pretrained.load_pretrained``), with ``model.args``
``dtype`` ("float32" or "bfloat16" storage) and ``remat``."""


def _declared(name: str) -> dict[str, tuple[type, bool, Any]]:
  """Option -> (its declared type, int or bool; whether None is allowed;
  its default), from the network's dataclass fields."""
  build, _ = _BUILDERS[name]
  # A functools.partial builder: the fields are its wrapped class's.
  cls = getattr(build, "func", build)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  declared = {}
  for option in _OPTIONS.get(name, ()):
    kind, optional = fields[option].type, False
    # Optional[int] is Union[int, None]: the option's kind is the member that
    # is not None, and None is then a valid value.
    if typing.get_origin(kind) is typing.Union:
      others = [t for t in typing.get_args(kind) if t is not type(None)]
      kind, optional = others[0], len(others) < len(typing.get_args(kind))
    declared[option] = (kind, optional, fields[option].default)
  return declared


def check_option(name: str, option: str, value) -> Any:
  """One option of network ``name`` checked by its declared type and
  normalised to it (numpy scalars to Python ``int`` / ``bool``).

  Every int option is a size or a count, an int >= 1 (a float, even 8.0,
  or a bool is refused); a bool option takes a bool only; ``projection``
  may also be None.

  Raises:
    TypeError: an unknown option, or a value of the wrong type, naming the
      model and the option.
    ValueError: a value out of range, naming the model and the option.
  """
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")
  declared = _declared(name)
  if option not in declared:
    raise TypeError(f"model {name!r} takes options {tuple(declared)}, "
                    f"got {[option]}")
  kind, optional, _ = declared[option]
  label = f"model {name!r}: {option}"
  if optional and value is None:
    return None
  # bool before int: a bool option must not take 1, and check_int refuses
  # bools for the int options.
  if kind is bool:
    checks.check_bool(label, value)
    return bool(value)
  checks.check_int(label, value, 1)
  return int(value)


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
  """Network ``name``'s options, each checked and normalised by
  ``check_option``, and together (``transformer_lm``'s width a multiple
  of its heads).

  Raises:
    TypeError, ValueError: naming the model and the option.
  """
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")
  declared = _declared(name)
  unknown = set(options) - set(declared)
  if unknown:
    raise TypeError(f"model {name!r} takes options {tuple(declared)}, "
                    f"got {sorted(unknown)}")
  checked = {option: check_option(name, option, value)
             for option, value in options.items()}
  if name == "transformer_lm":
    sizes = {option: checked.get(option, default)
             for option, (_, _, default) in declared.items()}
    if sizes["width"] % sizes["heads"]:
      raise ValueError(f"model {name!r}: width ({sizes['width']}) must be a "
                       f"multiple of heads ({sizes['heads']})")
  return checked


def _check_num_classes(num_classes) -> int:
  # bool is an int subclass and is refused; an integral float (10.0, as
  # JSON may give it) is accepted and returned as an int.
  if isinstance(num_classes, (bool, np.bool_)) or not isinstance(
      num_classes, (int, float, np.integer, np.floating)) or not float(
          num_classes).is_integer() or num_classes < 2:
    raise ValueError(f"num_classes must be an integer >= 2, got "
                     f"{num_classes!r}")
  return int(num_classes)


def module(name: str, num_classes: int, conv_impl: str = "auto",
           **kwargs) -> nn.Module:
  """The flax module behind ``get(name, ...)`` (for inspection and tests);
  the options are checked by ``check_options``."""
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")
  num_classes = _check_num_classes(num_classes)
  kwargs = check_options(name, kwargs)
  build, _ = _BUILDERS[name]
  cls = getattr(build, "func", build)
  if "conv_impl" in {f.name for f in dataclasses.fields(cls)}:
    checks.check_choice("conv_impl", conv_impl, layers.CONV_IMPLS)
    kwargs["conv_impl"] = conv_impl
  return build(num_classes=num_classes, **kwargs)


def default_input_shape(name: str) -> tuple[int, ...]:
  """[H, W, C] the model ``name`` is built for unless told otherwise."""
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")
  return _BUILDERS[name][1]


def get(name: str, num_classes: int = 10,
        input_shape: Optional[tuple[int, ...]] = None,
        conv_impl: str = "auto", **kwargs) -> Model:
  """Builds the network ``name`` as a ``Model`` (init/apply pair).

  Args:
    name: one of ``NAMES``.
    num_classes: size of the output layer.
    input_shape: shape of one example, (H, W, C) ([D] also works for
      ``mlp2``; (T,) tokens for ``SEQUENCE_MODELS``); default
      ``default_input_shape(name)``.
    conv_impl: lowering of every convolution, one of
      ``fedjax_agg.models.layers.CONV_IMPLS``; "auto" (the default) picks
      the fastest known one for the backend. All compute the same function.
    **kwargs: model options: ``hidden`` (mlp2's width, default 200; the
      LSTMs' units), ``batch_norm`` (vgg11 and mlp2, default False);
      ``embed_dim``, ``num_layers``, ``projection`` (LSTMs); ``width``,
      ``depth``, ``heads``, ``max_length`` (transformer_lm).

  Returns:
    ``Model(init, apply)``: ``init(key) -> variables``; ``apply(variables,
    x [B, *input_shape], train) -> (logits [B, num_classes],
    new_variables)`` (language models: tokens [B, T] -> logits
    [B, T, num_classes], with ``loss`` the sequence cross-entropy).
    Equal arguments give the same ``Model`` object (built once): what is
    compiled for a model (its evaluation) is reused by later runs.
  """
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")
  if input_shape is None:
    input_shape = default_input_shape(name)
  try:
    sizes = tuple(input_shape)
  except TypeError:
    sizes = ()
  if isinstance(input_shape, (str, bytes)) or not sizes:
    raise TypeError(f"input_shape must be a non-empty tuple of positive "
                    f"ints, got {input_shape!r}")
  for size in sizes:
    checks.check_int("input_shape", size, 1)
  checks.check_choice("conv_impl", conv_impl, layers.CONV_IMPLS)
  # Checked and normalised before the cache: equal options of other types
  # (13.0 for 13, 1 for True) are refused, never served another's model.
  options = (name, _check_num_classes(num_classes),
             tuple(int(d) for d in sizes), conv_impl,
             tuple(sorted(check_options(name, kwargs).items())))
  return _cached_build(*options)


def _build(name: str, num_classes: int, input_shape: tuple[int, ...],
           conv_impl: str, options: tuple) -> Model:
  """``get``'s network, its options as sorted ``(name, value)`` pairs."""
  net = module(name, num_classes, conv_impl, **dict(options))

  tokens = name in SEQUENCE_MODELS
  if tokens and len(input_shape) != 1:
    raise ValueError(f"input_shape of {name!r} must be (T,), the tokens of "
                     f"one sequence, got {input_shape!r}")

  def init(key):
    # One zero example fixes every parameter's shape; language models need
    # int32 token ids for their embedding.
    example = jnp.zeros((1,) + input_shape,
                        jnp.int32 if tokens else jnp.float32)
    return dict(net.init(key, example, train=False))

  def apply(variables, x, train: bool = False):
    # Only a BatchNorm network in training updates variables (its running
    # averages); otherwise they come back as they went in.
    if train and "batch_stats" in variables:
      logits, updates = net.apply(variables, x, train=True,
                                  mutable=["batch_stats"])
      return logits, {**variables, "batch_stats": updates["batch_stats"]}
    return net.apply(variables, x, train=train), variables

  if tokens:
    return Model(init, apply, sequence_cross_entropy)
  return Model(init, apply)


# Models are immutable; a run built from a config gets the model of the
# previous run with the same options, and with it the compiled evaluation.
_cached_build = functools.lru_cache(maxsize=64)(_build)


def _factory(name: str) -> Callable[..., Model]:
  """``get`` for network ``name``, with its own options in its signature
  (so ``REGISTRY.describe`` and config checks see them)."""
  build, _ = _BUILDERS[name]
  cls = getattr(build, "func", build)
  fields = {f.name: f.default for f in dataclasses.fields(cls)}

  def factory(**kwargs) -> Model:
    return get(name, **kwargs)

  common = [inspect.Parameter("num_classes", inspect.Parameter.KEYWORD_ONLY,
                              default=10),
            inspect.Parameter("input_shape", inspect.Parameter.KEYWORD_ONLY,
                              default=None),
            inspect.Parameter("conv_impl", inspect.Parameter.KEYWORD_ONLY,
                              default="auto")]
  options = [inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY,
                               default=fields.get(option))
             for option in _OPTIONS.get(name, ())]
  factory.__signature__ = inspect.Signature(common + options)
  factory.__name__ = factory.__qualname__ = name
  factory.__doc__ = f"``get({name!r}, ...)``."
  return factory


REGISTRY = Registry("model", {name: _factory(name) for name in _BUILDERS},
                    context=("num_classes", "input_shape"))
"""Every network by name: name -> factory, ``get(name, ...)`` with the network's
options in its signature; ``REGISTRY.build(name, num_classes=C, ...)``."""


def count_params(variables, collection: str = "params") -> int:
  """Number of scalars in ``variables[collection]``."""
  return int(sum(np.prod(np.shape(leaf)) for leaf in
                 jax.tree.leaves(variables.get(collection, {}))))
