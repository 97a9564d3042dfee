"""The network of a downloaded checkpoint as a run's model (``model.name``
"pretrained", ``model.base`` the Hugging Face folder).

``pretrained_model`` loads the folder (``models.pretrained``) and checks
it against the run's data before anything is trained: the data's examples
must be token sequences [T] no longer than the checkpoint's positions,
with token ids inside its vocabulary (the data tokenized with the
checkpoint's own ``tokenizer.json``). ``base_files`` is what a run
records of its base: the SHA-256 of every file its network is read from,
in the history's config and so in its checkpoints' fingerprint.
"""

from fedjax_agg import models
from fedjax_agg import spec as spec_lib
from fedjax_agg.models import pretrained

_WHERE = "model.base"


def _positions(config) -> int:
  return getattr(config, "n_positions", None) or (
      config.max_position_embeddings)


def pretrained_model(folder: str, options: dict, num_classes: int,
                     input_shape) -> tuple:
  """``(model, variables)`` of the checkpoint in ``folder`` with
  ``model.args`` ``options`` (``dtype``, ``remat``), refused with a
  ``spec.ConfigError`` at "model.base" where the data cannot be its
  input."""
  try:
    model, variables = pretrained.load_pretrained(
        folder, options.get("dtype", "float32"),
        remat=options.get("remat", False))
  except (TypeError, ValueError) as error:
    raise spec_lib.ConfigError(_WHERE, f"{_WHERE}: {error}") from None
  config = model.apply.config
  shape = tuple(input_shape)
  if len(shape) != 1:
    raise spec_lib.ConfigError(
        _WHERE, f"{_WHERE}: the checkpoint {folder!r} reads token sequences "
        f"[T]; the data's examples have shape {shape} (use a text task, e.g. "
        "dataset 'instructions')")
  if shape[0] > _positions(config):
    raise spec_lib.ConfigError(
        _WHERE, f"{_WHERE}: the data's sequences of {shape[0]} tokens are "
        f"longer than the checkpoint's {_positions(config)} positions "
        f"({folder}/config.json); shorten them (e.g. --dataset-arg "
        "sequence_length=...)")
  if num_classes > config.vocab_size:
    raise spec_lib.ConfigError(
        _WHERE, f"{_WHERE}: the data has {num_classes} token ids, more than "
        f"the checkpoint's vocab_size {config.vocab_size} "
        f"({folder}/config.json): tokenize it with the checkpoint's own "
        "tokenizer.json (--dataset-arg tokenizer=FOLDER)")
  return model, variables


def base_files(model_spec) -> dict:
  """What a run's config records of a checkpoint base: ``{"model.base_files":
  {file: SHA-256}}``, or nothing for other bases."""
  if model_spec.name != models.PRETRAINED:
    return {}
  try:
    return {"model.base_files": pretrained.checkpoint_files(model_spec.base)}
  except (OSError, ValueError) as error:
    raise spec_lib.ConfigError(_WHERE, f"{_WHERE}: {error}") from None
