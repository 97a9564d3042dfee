"""Hostile LoRA settings: every argument of ``lora.lora`` and of a
description's adapters is checked by name (lists, NaN, inf, sizes past
float32 or 32-bit seeds); a regular expression of targets is taken from
the command line; HetLoRA's per-client ranks are written in a config and
on the command line; a damaged base is refused naming it; FLoRA's uplink
counts what a client sends; and bfloat16 local training multiplies the
frozen base in bfloat16 too."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import checkpoint
from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg.models import lora
from fedjax_agg.models import mixed
from tests.lora import _util

SEED = 3


# ------------------------------------------------------ lora.lora's arguments


@pytest.mark.parametrize("kwargs,error,message", [
    ({"alpha": [1.0]}, TypeError, "alpha must be a number in"),
    ({"alpha": np.array([1.0])}, TypeError, "alpha must be a number in"),
    ({"alpha": 1e39}, ValueError, "alpha must be in"),
    ({"alpha": 1e300}, ValueError, "alpha must be in"),
    ({"dropout": [0.1]}, TypeError, "dropout must be a number in"),
    ({"dropout": np.array([0.1, 0.2])}, TypeError,
     "dropout must be a number in"),
    ({"key": None}, TypeError, "key must be a PRNG key"),
    ({"key": 0}, TypeError, "key must be a PRNG key"),
    ({"key": np.uint32(3)}, TypeError, "key must be a PRNG key"),
    ({"key": jax.random.split(jax.random.key(0), 2)}, TypeError,
     "key must be a PRNG key"),
])
def test_lora_refuses_each_bad_argument_by_name(kwargs, error, message):
  base = _util.mlp()
  variables = base.init(jax.random.key(0))
  arguments = {"rank": 2, "key": jax.random.key(1), **kwargs}
  with pytest.raises(error, match=f"^{message}"):
    lora.lora(base, variables, **arguments)


def test_the_largest_alpha_still_gives_a_finite_model():
  # alpha up to float32's largest: the scale alpha / r is finite, and the
  # model at initialisation (B = 0) is the base.
  base = _util.mlp()
  variables = base.init(jax.random.key(0))
  model = lora.lora(base, variables, rank=2, alpha=lora.MAX_ALPHA,
                    key=jax.random.key(1))
  x = np.ones((2, 4), np.float32)
  got, _ = model.apply(model.init(jax.random.key(2)), x)
  want, _ = base.apply(variables, x)
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="alpha"):
    lora.lora(base, variables, rank=2, alpha=2 * lora.MAX_ALPHA,
              key=jax.random.key(1))


# ---------------------------------------------- a description's adapters

MODEL = {"name": "mlp2", "args": {"hidden": 8}}


def _config(adapters=None, algorithm=None, **blocks):
  model = dict(MODEL)
  if adapters is not None:
    model["adapters"] = adapters
  return {"dataset": {"name": "fashion_mnist", "max_train_examples": 400,
                      "max_test_examples": 100},
          "partition": {"name": "iid", "num_clients": 4},
          "model": model,
          "train": {"rounds": 2, "participation": 0.5, "batch_size": 20,
                    "learning_rate": 0.5, "eval_clients": False},
          "algorithms": {"A": algorithm or {"aggregator": "fedit"}},
          "seeds": [SEED], **blocks}


@pytest.mark.parametrize("adapters,path", [
    ({"rank": 2, "seed": 2**63}, "model.adapters.seed"),
    ({"rank": 2, "seed": 2**32}, "model.adapters.seed"),
    ({"rank": 2, "alpha": 1e39}, "model.adapters.alpha"),
])
def test_the_spec_refuses_seeds_and_scales_past_their_types(adapters, path):
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(_config(adapters))
  assert raised.value.path == path, str(raised.value)


def test_the_largest_32_bit_seed_builds():
  config = _config({"rank": 2, "seed": 2**32 - 1})
  built = experiment.build(config, "A", experiment.prepare_data(config,
                                                                SEED))
  assert lora.is_adapters(built.model.init(jax.random.key(0)))
  with pytest.raises(spec.ConfigError, match="model.adapters.seed"):
    experiment.check_config(_config({"rank": 2, "seed": 2**32}))


# ------------------------------------------------------- --lora-targets REGEX


def test_a_regular_expression_of_targets_from_the_command_line():
  run, name = cli.resolve(*cli.parse([
      "--dataset", "fashion_mnist", "--max-train-examples", "400",
      "--num-clients", "4", "--model", "mlp2", "--model-arg", "hidden=8",
      "--aggregator", "fedit", "--lora-rank", "2", "--lora-targets",
      r"fc\d"]))
  assert run.model.adapters.targets == r"fc\d"
  assert run.model.adapters.patterns() == (r"fc\d",)
  # The written-out description reads back as the same run.
  assert spec.Experiment.from_dict(run.to_dict()).model.adapters == (
      run.model.adapters)
  # One layer: only fc1 is adapted, r (d_in + d_out) = 2 (784 + 8).
  config = experiment.override(run.to_dict(),
                               {"model.adapters.targets": "fc1"})
  built = experiment.build(config, name,
                           experiment.prepare_data(config, 0))
  params = built.model.init(jax.random.key(0))
  assert set(params[lora.ADAPTERS]) == {"fc1"}
  assert sum(leaf.size for leaf in jax.tree.leaves(params)) == 2 * (784 + 8)
  # A language model's targets are matched whatever its max_length.
  run, _ = cli.resolve(*cli.parse([
      "--dataset", "shakespeare", "--model", "transformer_lm",
      "--model-arg", "max_length=8", "--model-arg", "width=16",
      "--aggregator", "fedit", "--lora-rank", "2", "--lora-targets",
      r"_Block_0/Dense_\d"]))
  assert run.model.adapters.patterns() == (r"_Block_0/Dense_\d",)


def test_a_pattern_matching_no_layer_names_the_layers(tmp_path, capsys):
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as raised:
    cli.main(["--dataset", "fashion_mnist", "--max-train-examples", "400",
              "--num-clients", "4", "--model", "mlp2", "--model-arg",
              "hidden=8", "--rounds", "1", "--aggregator", "fedit",
              "--lora-rank", "2", "--lora-targets", "fc9", "--no-progress",
              "--out", str(out)])
  assert raised.value.code == 2
  lines = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith(("config: ", "note: "))]
  assert lines == ["error: --lora-targets: model.adapters.targets: "
                   "targets: 'fc9' matches no Dense layer; the Dense layers "
                   "are ['fc1', 'fc2']"]
  assert not out.exists()
  # In a config: the pattern at fault by its path, also in a list and in
  # an algorithm's own adapters.
  with pytest.raises(spec.ConfigError, match="not a regular") as error:
    experiment.check_config(_config({"rank": 2, "targets": "fc("}))
  assert error.value.path == "model.adapters.targets"
  for adapters, algorithm, path in [
      ({"rank": 2, "targets": ["fc1", "conv1"]}, None,
       "model.adapters.targets[1]"),
      ({"rank": 2, "targets": "transformer"}, None,
       "model.adapters.targets"),
      (None, {"aggregator": "fedit",
              "adapters": {"rank": 2, "targets": ["head"]}},
       "algorithms.A.adapters.targets[0]")]:
    with pytest.raises(spec.ConfigError, match="fc1") as error:
      experiment.check_config(_config(adapters, algorithm))
    assert error.value.path == path, str(error.value)


# ------------------------------------------------- HetLoRA's per-client ranks

HETLORA = {"aggregator": "hetlora", "client": "lora_ranks",
           "client_args": {"ranks": [1, 1, 2, 2]}}


def _assert_ranks_applied(params, max_rank=2):
  """HetLoRA zero-pads: components past every client's rank are zero in
  the global adapters after a round, the others are not."""
  for node in params[lora.ADAPTERS].values():
    a, b = np.asarray(node["a"]), np.asarray(node["b"])
    assert not np.any(a[max_rank:]) and not np.any(b[:, max_rank:])
    assert np.all(np.any(a[:max_rank] != 0, axis=1))


def test_hetlora_ranks_run_from_a_json_config(tmp_path):
  config = json.loads(json.dumps(_config({"rank": 3}, HETLORA)))
  checked = experiment.check_config(config)
  assert checked.algorithms["A"].client == "lora_ranks"
  prepared = experiment.prepare_data(config, SEED)
  result = experiment.run_algorithm(config, "A", SEED, prepared)
  _assert_ranks_applied(result.state.params)
  np.testing.assert_array_equal(result.state.client_state.ranks,
                                [1, 1, 2, 2])
  # The written-out description keeps the ranks.
  written = checked.to_dict()
  assert written["algorithms"]["A"]["client_args"]["ranks"] == [1, 1, 2, 2]


def test_hetlora_ranks_run_from_the_command_line(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main([
      "--dataset", "fashion_mnist", "--max-train-examples", "400",
      "--num-clients", "4", "--model", "mlp2", "--model-arg", "hidden=8",
      "--rounds", "2", "--participation", "0.5", "--batch-size", "20",
      "--no-progress", "--no-client-eval", "--aggregator", "hetlora",
      "--client", "lora_ranks", "--client-arg", "ranks=[1,1,2,2]",
      "--client-arg", "self_pruning=0.5", "--lora-rank", "3",
      "--out", str(out)]) == 0
  capsys.readouterr()
  record = json.loads((out / "config.json").read_text())
  algorithm = record["algorithms"]["hetlora"]
  assert algorithm["client"] == "lora_ranks"
  assert algorithm["client_args"]["ranks"] == [1, 1, 2, 2]
  rows = json.loads((out / "history.json").read_text())["rows"]
  assert len(rows) == 3 and np.isfinite(rows[-1]["test_loss"])
  # The record runs again as it is.
  again = experiment.check_config(record)
  assert again.algorithms["hetlora"].client_args["self_pruning"] == 0.5


@pytest.mark.parametrize("client_args,objective,path", [
    ({}, "cross_entropy", "algorithms.A.client_args.ranks"),
    ({"ranks": [1, 2, 3]}, "cross_entropy",
     "algorithms.A.client_args.ranks"),
    ({"ranks": 3}, "cross_entropy", "algorithms.A.client_args.ranks"),
    ({"ranks": [1, 2, 3, 4]}, "cross_entropy",
     "algorithms.A.client_args.ranks[3]"),
    ({"ranks": [1, 2.0, 3, 3]}, "cross_entropy",
     "algorithms.A.client_args.ranks[1]"),
    ({"ranks": [1, 2, 3, 3], "self_pruning": 1.0}, "cross_entropy",
     "algorithms.A.client_args.self_pruning"),
    ({"ranks": [1, 2, 3, 3], "self_pruning": 0.5}, "fedprox",
     "algorithms.A.objective"),
])
def test_bad_ranks_are_refused_naming_their_path(client_args, objective,
                                                 path):
  algorithm = {"aggregator": "hetlora", "client": "lora_ranks",
               "client_args": client_args, "objective": objective}
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(_config({"rank": 3}, algorithm))
  assert raised.value.path == path, str(raised.value)


# ------------------------------------------------ a missing or damaged base


def _damaged_bases(root):
  """Folders that hold no readable saved variables, by what is wrong."""
  variables = _util.mlp().init(jax.random.key(0))
  bases = {"empty": root / "empty"}
  bases["empty"].mkdir()
  (root / "no_arrays_folder" / "variables").mkdir(parents=True)
  bases["no_arrays_folder"] = root / "no_arrays_folder"
  for damage in ("no_metadata", "garbage_metadata"):
    folder = root / damage
    checkpoint.save_variables(str(folder), variables)
    metadata = folder / checkpoint.VARIABLES / "_METADATA"
    if damage == "no_metadata":
      metadata.unlink()
    else:
      metadata.write_text("{not json")
    bases[damage] = folder
  return bases


def test_a_damaged_base_is_refused_naming_the_folder(tmp_path, capsys):
  template = jax.eval_shape(_util.mlp().init, jax.random.key(0))
  for damage, folder in _damaged_bases(tmp_path).items():
    # Python: the loader names the folder.
    with pytest.raises(checkpoint.CheckpointError, match=str(folder)):
      checkpoint.load_variables(str(folder), template)
    # A description: refused at model.base, before the data is read.
    config = _config({"rank": 2})
    config["model"]["base"] = str(folder)
    with pytest.raises(spec.ConfigError, match=str(folder)) as raised:
      experiment.check_config(config)
    assert raised.value.path == "model.base", damage
    # The command line: one line naming --base and the folder, exit 2,
    # nothing written.
    out = tmp_path / f"run_{damage}"
    with pytest.raises(SystemExit) as exited:
      cli.main(["--dataset", "fashion_mnist", "--max-train-examples", "400",
                "--num-clients", "4", "--model", "mlp2", "--rounds", "1",
                "--aggregator", "fedit", "--lora-rank", "2", "--base",
                str(folder), "--no-progress", "--out", str(out)])
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines()
             if not line.startswith(("config: ", "note: "))]
    assert len(lines) == 1, (damage, lines)
    assert lines[0].startswith(f"error: --base: model.base: {folder}"), (
        lines)
    assert not out.exists()


# ---------------------------------------------------------- FLoRA's uplink


def test_floras_uplink_counts_a_and_b_not_the_merged_leaves():
  config = _config({"rank": 2}, {"aggregator": "flora"}, systems={})
  prepared = experiment.prepare_data(config, SEED)
  result = experiment.run_algorithm(config, "A", SEED, prepared)
  # Independently: what a client sends is A [r, d_in] and B [d_out, r] of
  # fc1 (784 -> 8) and fc2 (8 -> 10) in float32.
  rank = 2
  per_client = 4 * sum(rank * d_in + d_out * rank
                       for d_in, d_out in [(784, 8), (8, 10)])
  assert per_client == 6480
  cohort = 2  # participation 0.5 of 4 clients
  assert result.history.column("uplink_bytes")[1:].tolist() == [
      cohort * per_client * r for r in (1, 2)]
  # The params hold the merged leaves too (d_out x d_in each): they are
  # what the server keeps, not what a client sends.
  nodes = result.state.params[lora.ADAPTERS]
  assert nodes["fc1"]["merged"].shape == (8, 784)
  assert lora.uplink_bytes(result.state.params) == per_client


# ------------------------------------------------- bfloat16 local training


def _dot_operand_dtypes(closed_jaxpr):
  """The operand dtypes of every dot_general of a jaxpr, sub-jaxprs
  (jit, custom_jvp, remat) included."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)

  walk(closed_jaxpr.jaxpr)
  return found


@pytest.mark.parametrize("options", [{}, {"freeze_a": True},
                                     {"merged": True}])
def test_bfloat16_training_multiplies_the_frozen_base_in_bfloat16(options):
  base = _util.transformer()
  model = lora.lora(base, base.init(jax.random.key(0)), rank=2,
                    targets=lora.TRANSFORMER_TARGETS, key=jax.random.key(1),
                    **options)
  adapters = model.init(jax.random.key(2))
  tokens = np.zeros((3, _util.LENGTH), np.int32)

  def loss(apply):
    return lambda a: jnp.sum(apply(a, tokens, True)[0])

  # Local training's forward and backward pass: every product takes
  # bfloat16 operands, the base's as the adapters'. (The attention
  # projections, the MLP, the output layer: 2 x 6 + 1 products forward.)
  low = mixed.bfloat16_compute(model)
  dtypes = _dot_operand_dtypes(jax.make_jaxpr(jax.value_and_grad(
      loss(low.apply)))(adapters))
  assert len(dtypes) > 13
  assert set(dtypes) == {("bfloat16", "bfloat16")}, dtypes
  # Evaluation (float32 adapters): float32 throughout, as before.
  dtypes = _dot_operand_dtypes(jax.make_jaxpr(loss(model.apply))(adapters))
  assert set(dtypes) == {("float32", "float32")}, dtypes
  # And bfloat16 computes the same network, to bfloat16's precision.
  np.testing.assert_allclose(
      np.asarray(low.apply(adapters, tokens, False)[0], np.float32),
      np.asarray(model.apply(adapters, tokens, False)[0]), atol=0.1)
