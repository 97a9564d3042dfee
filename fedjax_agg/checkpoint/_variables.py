"""A network's variables saved and restored with orbax (e.g. a
pre-trained base named by a description's ``model.base``).

``save_variables`` writes them to ``<directory>/variables``;
``saved_variables`` reads back their leaves and shapes from the metadata
alone; ``load_variables`` restores them into a template's tree after
checking that the leaves and shapes are the network's.
"""

import logging
import os

import jax
import orbax.checkpoint as ocp

from fedjax_agg.checkpoint._errors import CheckpointError
from fedjax_agg.checkpoint._errors import CorruptCheckpointError


VARIABLES = "variables"
"""The orbax item of ``save_variables``' folder."""


def save_variables(directory: str, variables) -> str:
  """Saves a network's variables (e.g. a pre-trained base) to
  ``<directory>/variables`` with orbax, for ``load_variables`` and a
  description's ``model.base``. Returns ``directory``."""
  path = os.path.join(os.path.abspath(directory), VARIABLES)
  checkpointer = ocp.StandardCheckpointer()
  # force=True: saving again into the same folder replaces the earlier save
  # (orbax refuses an existing folder otherwise).
  checkpointer.save(path, variables, force=True)
  checkpointer.wait_until_finished()
  # orbax's note of success names the absolute folder; restoring does not
  # read it, and a committed base carries no machine's paths.
  marker = os.path.join(path, "commit_success.txt")
  if os.path.exists(marker):
    os.remove(marker)
  return directory


def load_variables(directory: str, template):
  """The variables ``save_variables`` wrote to ``directory``, restored
  into ``template``'s tree, shapes and dtypes (e.g.
  ``jax.eval_shape(model.init, key)``).

  Raises:
    CheckpointError: naming ``directory``: nothing saved there, or
      variables of another network (another tree or shapes).
  """
  path = os.path.join(os.path.abspath(directory), VARIABLES)
  refused = (f"{directory}: its variables are not those of this network "
             "(the model's name and arguments must be the base's): ")
  # The saved leaves and shapes are compared before any array is read: a
  # refused restore would leave orbax's pending reads behind.
  saved = saved_variables(directory)
  wanted = _leaf_shapes(template)
  for leaf in sorted(set(saved) ^ set(wanted)):
    where = "the saved variables" if leaf in saved else "the network"
    raise CheckpointError(f"{refused}only {where} have {leaf}")
  for leaf, shape in sorted(wanted.items()):
    if saved[leaf] != shape:
      raise CheckpointError(f"{refused}{leaf} is {saved[leaf]} saved, "
                            f"{shape} in the network")
  try:
    return ocp.StandardCheckpointer().restore(path, template)
  except (ValueError, KeyError, TypeError) as error:
    # orbax's first sentence names the leaf; the rest is about its own API.
    raise CheckpointError(refused + str(error).split(". ")[0]) from None
  except Exception as error:  # pylint: disable=broad-except
    # A damaged array file: tensorstore raises a bare Exception.
    raise CorruptCheckpointError(
        f"{directory}: the saved arrays in {path} cannot be read (a damaged "
        f"or partial save): {str(error).split('. ')[0][:200]}") from None


def saved_variables(directory: str) -> dict:
  """{leaf path: shape} of the variables ``save_variables`` wrote to
  ``directory``, from their metadata (no array is read).

  Raises:
    CheckpointError: naming ``directory``: nothing saved there;
      ``CorruptCheckpointError`` where the metadata cannot be read (a
      damaged or partial save).
  """
  path = os.path.join(os.path.abspath(directory), VARIABLES)
  if not os.path.isdir(path):
    raise CheckpointError(f"{directory}: no saved variables (expected "
                          f"{VARIABLES}/ written by save_variables)")
  damaged = (f"{directory}: the saved variables in {path} cannot be read "
             "(a damaged or partial save: its metadata ")
  # orbax logs its own warning before returning no metadata; the error
  # below says it once.
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  # Raised only for this call and restored in ``finally``: the caller's logging
  # setup is left as it was.
  absl_logger.setLevel(logging.ERROR)
  try:
    metadata = ocp.StandardCheckpointer().metadata(path).item_metadata
  except (OSError, ValueError, TypeError, KeyError, AttributeError):
    # orbax's own parse of a malformed file fails in any of these ways.
    raise CorruptCheckpointError(f"{damaged}is malformed)") from None
  finally:
    absl_logger.setLevel(level)
  # orbax answers a missing metadata file with no tree (after its warning).
  tree = getattr(metadata, "tree", None)
  if tree is None:
    raise CorruptCheckpointError(f"{damaged}is missing or unreadable)")
  try:
    return _leaf_shapes(tree)
  except (AttributeError, TypeError, ValueError):
    raise CorruptCheckpointError(f"{damaged}is malformed)") from None


def _leaf_shapes(tree) -> dict:
  """{leaf path: shape} of a tree of arrays or of orbax's array metadata."""
  leaves = jax.tree_util.tree_flatten_with_path(
      # Anything with a shape is a leaf: orbax's array metadata objects are not
      # arrays, and the template's leaves may be ShapeDtypeStructs.
      tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {jax.tree_util.keystr(key): tuple(leaf.shape)
          for key, leaf in leaves}
