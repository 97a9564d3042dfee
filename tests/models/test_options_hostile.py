"""Hostile model options: every option of every network is checked by its
declared type and range before anything is built or cached, naming the
model and the option, in Python, a JSON config and on the command line;
and the command line checks the options against the model the run
builds."""

import math

import jax
import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import models
from fedjax_agg import spec

# Every (model, option) pair the library declares, from the registry.
_OPTIONS = [(name, option) for name in models.NAMES
            for option in spec.model_parameters(name)
            if option != "conv_impl"]


def _is_bool_option(name, option):
  return isinstance(spec.model_parameters(name)[option].default, bool)


@pytest.mark.parametrize("value", [[8], math.nan, math.inf, 8.5, "8", True,
                                   13.0, None, np.float32(4.0)])
def test_a_size_of_the_wrong_type_is_refused_naming_model_and_option(value):
  with pytest.raises(TypeError, match=r"model 'mlp2': hidden must be an "
                     r"int >= 1"):
    models.get("mlp2", num_classes=10, hidden=value)


@pytest.mark.parametrize("value", [0, -1, np.int64(-3)])
def test_a_size_out_of_range_is_refused_naming_model_and_option(value):
  with pytest.raises(ValueError, match=r"model 'mlp2': hidden must be an "
                     r"int >= 1"):
    models.get("mlp2", num_classes=10, hidden=value)


@pytest.mark.parametrize("name,option", _OPTIONS)
def test_every_option_of_every_network_is_checked(name, option):
  wrong = 1 if _is_bool_option(name, option) else True
  with pytest.raises(TypeError, match=f"model '{name}': {option} must be"):
    models.get(name, num_classes=10, **{option: wrong})
  with pytest.raises(TypeError, match=f"model '{name}': {option} must be"):
    models.module(name, 10, **{option: "2"})


def test_a_bool_option_takes_a_bool_only():
  with pytest.raises(TypeError, match="model 'vgg11': batch_norm must be a "
                     "bool, got 1"):
    models.get("vgg11", num_classes=10, batch_norm=1)
  # The LSTMs' projection may be None (no projection layer).
  model = models.get("char_lstm", num_classes=5, input_shape=(3,), hidden=4,
                     embed_dim=2, projection=None)
  assert "Dense_1" not in model.init(jax.random.key(0))["params"]


def test_width_must_be_a_multiple_of_heads_before_anything_is_built():
  with pytest.raises(ValueError, match="model 'transformer_lm': width "
                     r"\(10\) must be a multiple of heads \(4\)"):
    models.get("transformer_lm", num_classes=5, width=10)
  models.get("transformer_lm", num_classes=5, input_shape=(4,), width=10,
             heads=5, depth=1, max_length=4)


def test_equal_options_of_another_type_never_share_a_cached_model():
  # hidden=13.0 is refused, not served the cached model of hidden=13; a
  # numpy int is normalised to the same option (and the same model).
  thirteen = models.get("mlp2", num_classes=10, input_shape=(4,), hidden=13)
  with pytest.raises(TypeError, match="hidden"):
    models.get("mlp2", num_classes=10, input_shape=(4,), hidden=13.0)
  assert models.get("mlp2", num_classes=10, input_shape=(4,),
                    hidden=np.int64(13)) is thirteen
  params = thirteen.init(jax.random.key(0))["params"]
  assert params["fc1"]["kernel"].shape == (4, 13)


@pytest.mark.parametrize("kwargs,error,named", [
    ({"num_classes": math.nan}, ValueError, "num_classes"),
    ({"num_classes": [10]}, ValueError, "num_classes"),
    ({"input_shape": (28.5, 28, 1)}, TypeError, "input_shape"),
    ({"input_shape": 28}, TypeError, "input_shape"),
    ({"conv_impl": "fast"}, ValueError, "conv_impl"),
])
def test_the_given_arguments_are_checked_by_name(kwargs, error, named):
  with pytest.raises(error, match=named):
    models.get("cnn_mcmahan", **{"num_classes": 10, **kwargs})


def _config(args, name="mlp2"):
  return {"dataset": {"name": "fashion_mnist"},
          "partition": {"name": "iid", "num_clients": 4},
          "model": {"name": name, "args": args},
          "algorithms": {"A": {"aggregator": "fedavg"}}}


@pytest.mark.parametrize("args,path", [
    ({"hidden": True}, "model.args.hidden"),
    ({"hidden": 8.0}, "model.args.hidden"),
    ({"hidden": 0}, "model.args.hidden"),
    ({"batch_norm": 1}, "model.args.batch_norm"),
])
def test_a_config_names_the_bad_option_by_its_path(args, path):
  with pytest.raises(spec.ConfigError, match="model 'mlp2'") as raised:
    spec.Experiment.from_dict(_config(args))
  assert raised.value.path == path


def test_an_algorithms_model_args_are_checked_too():
  config = _config({"hidden": 8})
  config["algorithms"]["A"]["model_args"] = {"hidden": -2}
  with pytest.raises(spec.ConfigError, match="model 'mlp2': hidden") as (
      raised):
    spec.Experiment.from_dict(config)
  assert raised.value.path == "algorithms.A.model_args.hidden"


def test_the_command_line_refuses_a_bool_size_before_writing(tmp_path,
                                                             capsys):
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as raised:
    cli.main(["--dataset", "fashion_mnist", "--model", "mlp2",
              "--model-arg", "hidden=True", "--rounds", "1",
              "--no-progress", "--out", str(out)])
  assert raised.value.code == 2
  lines = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith(("config: ", "note: "))]
  assert lines == ["error: --model-arg: model.args.hidden: model 'mlp2': "
                   "hidden must be an int >= 1, got True (bool)"]
  assert not out.exists()


def test_a_text_tasks_model_options_are_checked_against_its_model():
  # --dataset shakespeare without --model builds the char-LSTM: its
  # options are the ones --model-arg sets and checks.
  run, _ = cli.resolve(*cli.parse(["--dataset", "shakespeare",
                                   "--model-arg", "hidden=8"]))
  assert run.model.name == "char_lstm"
  assert run.model.args == {"hidden": 8}
  with pytest.raises(cli.UsageError, match="model 'char_lstm': hidden"):
    cli.resolve(*cli.parse(["--dataset", "shakespeare", "--model-arg",
                            "hidden=0"]))
  # An explicit --model still wins.
  run, _ = cli.resolve(*cli.parse(["--dataset", "shakespeare", "--model",
                                   "transformer_lm", "--model-arg",
                                   "width=16"]))
  assert run.model.name == "transformer_lm"
