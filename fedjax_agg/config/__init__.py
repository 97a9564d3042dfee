"""Configuration objects: one name and one default per concept.

Hyperparameters travel as small frozen objects passed whole, from the
driver (``simulation.run``, ``sweep.run_sweep``) down to the round
(``rounds.make_round_fn``) and the engine (``engine.make_local_trainer``):

* ``LocalTraining``: what each client does (epochs, batch size, optimizer,
  learning rate, local objective, per-client losses, step budgets), its
  optimizer as a description names it (``ClientOptimizer``);
* ``Execution``: how the rounds are computed (chunk width, devices, chunk
  loop, streaming, cohort sampler, progress bar); it never changes a
  result beyond float rounding;
* ``Evaluation``: when and on what the global model is evaluated;
* ``Checkpointing``: where and how often the whole run is saved;
* ``Systems``: the clients' simulated clock (speeds, bandwidths,
  availability, over-selection, deadlines) and the uplink codec.

Every field is checked when the object is built, so a bad value raises a
``ValueError``/``TypeError`` naming the field before anything runs. The
learning rate may be a traced value (sweeps build ``LocalTraining`` inside
``jax.vmap``); its range is then checked on the concrete values first.

One module per object: ``_training`` (``LocalTraining``, the client
optimizers), ``_execution``, ``_evaluation``, ``_run`` (``Checkpointing``,
``NonFinite``), ``_privacy`` and ``_systems``. The fields a description
sets are declared on these objects with their default, flag and check
(``declared.spec_field``): ``Systems`` and ``Privacy`` are the
description's "systems" and "privacy" sections, and "train" is made of
the declared fields of ``LocalTraining``, ``ClientOptimizer``,
``Evaluation`` and ``Execution`` (with ``RunOptions``' and
``stragglers.Stragglers``').
"""

from fedjax_agg.config._evaluation import Evaluation
from fedjax_agg.config._execution import CHUNK_LOOPS
from fedjax_agg.config._execution import Execution
from fedjax_agg.config._privacy import ACCOUNTANTS
from fedjax_agg.config._privacy import Privacy
from fedjax_agg.config._privacy import SAMPLINGS
from fedjax_agg.config._run import Checkpointing
from fedjax_agg.config._run import NonFinite
from fedjax_agg.config._run import NONFINITE_CLIENTS
from fedjax_agg.config._run import NONFINITE_MODEL
from fedjax_agg.config._systems import Systems
from fedjax_agg.config._training import client_optimizer
from fedjax_agg.config._training import ClientOptimizer
from fedjax_agg.config._training import ComputeLosses
from fedjax_agg.config._training import LocalStepsFn
from fedjax_agg.config._training import LocalTraining
from fedjax_agg.config._training import MATMUL_PRECISIONS
from fedjax_agg.config._training import OptimizerFactory
from fedjax_agg.config._training import OPTIMIZERS
from fedjax_agg.config._training import sgd_momentum
from fedjax_agg import deprecation
from fedjax_agg import evaluation as _evaluation

__all__ = ["ACCOUNTANTS", "CHUNK_LOOPS", "Checkpointing", "ClientOptimizer",
           "ComputeLosses",
           "Evaluation", "Execution", "LocalStepsFn",
           "LocalTraining", "MATMUL_PRECISIONS", "NONFINITE_CLIENTS",
           "NONFINITE_MODEL", "NonFinite", "OptimizerFactory", "OPTIMIZERS",
           "Privacy", "SAMPLINGS", "Systems", "client_optimizer",
           "sgd_momentum"]

# ``Evaluation.extra``'s element type lives with the evaluation; it was
# exported here before.
__getattr__ = deprecation.moved_names(__name__, {
    "EvalSet": ("fedjax_agg.evaluation", _evaluation.EvalSet)})
