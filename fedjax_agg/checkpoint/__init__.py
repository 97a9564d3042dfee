"""Checkpoint and resume of ``simulation.run`` with orbax.

``simulation.run(..., checkpointing=Checkpointing(d, every=n))`` saves the
whole run every ``n`` rounds (and after the last round);
``Checkpointing(d, every=n, resume=True)`` continues from the latest
checkpoint in ``d`` and gives the history and final params of the
uninterrupted run (every column but the wall-clock ``time_s``). Resuming
with a larger ``num_rounds`` extends a finished run: the cohort keys of a
run are a prefix of a longer run's, so the extended run equals the longer
uninterrupted one (every column, given an evaluation schedule that does not
depend on R: the last round of the shorter run was evaluated as a last
round -- on the test set, and on the clients' data under the default
``Evaluation(clients="auto")``).

What must match. The checkpoint's config is a description of everything
that decides the results (``simulation.run``'s fingerprint): the training
configuration, seed, model, aggregator and local update (with the scalars
their closures hold) and the CONTENT of the data -- CRC-32s of the pooled
examples (another dataset or preprocessing differs), of every client's
index row (another partition of equal sizes differs), of the validation
split and of the test set. Each differing entry is named.

What a checkpoint holds. One directory per saved round, ``<d>/<round>/``,
with three orbax items written together:

* ``state``: every array leaf of the run's ``ServerState`` (global params,
  the aggregator's whole state -- for FedDRL the networks, targets, Adam
  states, replay buffer and the agent's key --, the round counter, the
  state's PRNG key) and the run key the per-round cohort keys are split
  from. Typed PRNG keys (``jax.random.key``) are stored as their
  ``key_data`` and wrapped back with their implementation on restore.
* ``history``: the History rows so far (JSON) and the client rows (each
  per-client field stacked over rounds into one array of ``state``, with
  its dtype and CRC-32; other values as JSON), so a restored history
  equals the original bit for bit; its CRC-32 is in ``meta``, so an
  edited history is refused like a damaged array.
* ``meta``: format version, round, the run's config (hyperparameters, a
  description of the aggregator / objective / optimizer including the
  scalars their closures hold, a fingerprint of the data) and the spec of
  every state leaf: tree path, shape, dtype, PRNG implementation, CRC-32.

Atomicity. orbax writes a step to ``<d>/<round>.orbax-checkpoint-tmp``,
writes ``commit_success.txt`` last and renames the folder to ``<d>/<round>``
(one ``rename``, atomic on POSIX file systems; on GCS orbax marks
completion with that file instead); a folder without the temporary suffix
is therefore complete. Temporary folders of a killed run are deleted when
the run is resumed. Only the latest ``max_to_keep`` (2)
checkpoints are kept, so a damaged latest one leaves an earlier one.

Errors, never a silent restart. Resuming raises ``CheckpointMismatchError``
naming every config entry, tree path, shape or dtype that differs from the
run asked for, and ``CorruptCheckpointError`` when a checkpoint cannot be
read or a leaf's CRC-32 differs (it names the earlier checkpoints one could
resume from by deleting the damaged one). Starting a run without
``resume`` in a folder that already holds checkpoints is an error too.
``resume=True`` with no checkpoint in the folder starts at round 0 (and
logs that), so a job script can always pass it.

What may change between the killed and the resumed run: the progress bar,
``checkpoint_every``, and how the round is executed (``clients_per_step``,
``unroll``, ``mesh``); the latter change float rounding, so the history is
then equal to float tolerance rather than bit for bit.

Saves are asynchronous: the state is copied to host memory before
``save`` returns, and orbax writes it while the next rounds run.

Model variables. ``save_variables`` saves a network's variables (e.g. a
pre-trained base, a description's ``model.base``) to
``<directory>/variables`` with orbax; ``load_variables`` restores them
into a template's tree, refusing another network's (``CheckpointError``)
or a damaged save (``CorruptCheckpointError``); ``saved_variables`` lists
their leaves and shapes without reading an array.

Modules: ``_errors`` (the errors), ``_run`` (the checkpoints of one run:
``RunCheckpointer``, ``open_run``), ``_variables`` (a network's saved
variables).
"""

from fedjax_agg.checkpoint._errors import CheckpointError
from fedjax_agg.checkpoint._errors import CheckpointMismatchError
from fedjax_agg.checkpoint._errors import CorruptCheckpointError
from fedjax_agg.checkpoint._run import check_arguments
from fedjax_agg.checkpoint._run import FORMAT_VERSION
from fedjax_agg.checkpoint._run import held_rounds
from fedjax_agg.checkpoint._run import ITEMS
from fedjax_agg.checkpoint._run import MAX_TO_KEEP
from fedjax_agg.checkpoint._run import open_run
from fedjax_agg.checkpoint._run import RunCheckpointer
from fedjax_agg.checkpoint._run import Snapshot
from fedjax_agg.checkpoint._run import spec_differences
from fedjax_agg.checkpoint._variables import load_variables
from fedjax_agg.checkpoint._variables import save_variables
from fedjax_agg.checkpoint._variables import saved_variables
from fedjax_agg.checkpoint._variables import VARIABLES
from fedjax_agg import deprecation
from fedjax_agg import fingerprint

__all__ = ["CheckpointError", "CheckpointMismatchError",
    "CorruptCheckpointError", "FORMAT_VERSION", "ITEMS", "MAX_TO_KEEP",
    "RunCheckpointer", "Snapshot", "check_arguments", "held_rounds",
    "load_variables", "open_run",
    "save_variables", "saved_variables", "spec_differences", "VARIABLES"]

# What must match is described by ``fedjax_agg.fingerprint``; its names
# lived here before.
__getattr__ = deprecation.moved_names(__name__, {
    name: ("fedjax_agg.fingerprint", getattr(fingerprint, name))
    for name in ("config_differences", "data_fingerprint", "describe")})
