"""The population's model arguments, checked where a ``config.Systems``'
objects are built (``clock.built``, once a run, with
``systems.check_model_arguments``), before the run knows N: the same
refusals the run's population build gives, named, and trace files that
exist still accepted."""

import numpy as np
import pytest

from fedjax_agg import clock
from fedjax_agg import systems
from fedjax_agg.config import Systems as _Systems


def Systems(**kwargs):  # pylint: disable=invalid-name
  """A ``config.Systems`` with its objects built (its checks run)."""
  described = _Systems(**kwargs)
  clock.built(described)
  return described

MARKOV = {"mean_online_s": 10.0, "mean_offline_s": 5.0}


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(availability="markov",
          availability_args={**MARKOV, "mean_online_s": 0.0}),
     ValueError, r"^availability_args: mean_online_s must be > 0"),
    (dict(availability="markov",
          availability_args={**MARKOV, "mean_offline_s": -3.0}),
     ValueError, r"^availability_args: mean_offline_s must be > 0"),
    (dict(availability="markov", availability_args={"mean_online_s": 1.0}),
     TypeError, r"^availability_args: .*mean_offline_s"),
    (dict(availability="markov", availability_args={**MARKOV, "seed": 3}),
     TypeError, r"^availability_args: \['seed'\] come from the run"),
    (dict(availability="diurnal", availability_args={"online_hours": 30.0}),
     ValueError, r"^availability_args: online_hours must be in \[0, "),
    (dict(availability="diurnal",
          availability_args={"online_hours": 1.0, "period_s": 0.0}),
     ValueError, r"^availability_args: period_s must be > 0"),
    (dict(profiles="lognormal", profile_args={"speed_median": 0.0}),
     ValueError, r"^profile_args: speed_median must be > 0"),
    (dict(profiles="lognormal", profile_args={"downlink_sigma": -1.0}),
     ValueError, r"^profile_args: downlink_sigma must be >= 0"),
    (dict(profiles="constant", profile_args={"uplink": 0.0}),
     ValueError, r"^profile_args: uplink must be > 0"),
    (dict(profiles="constant", profile_args={"speed": float("nan")}),
     ValueError, r"^profile_args: speed must be > 0"),
    (dict(profiles="constant", profile_args={"speed": "fast"}),
     TypeError, r"^profile_args: speed must be a number"),
])
def test_bad_model_arguments_are_refused_when_systems_is_built(
    kwargs, error, match):
  with pytest.raises(error, match=match):
    Systems(**kwargs)


def test_the_refusals_are_those_of_the_population_build():
  """Built with N, the run's factories give the same message (without the
  argument group in front)."""
  with pytest.raises(ValueError) as at_construction:
    Systems(availability="markov",
            availability_args={**MARKOV, "mean_online_s": 0.0})
  with pytest.raises(ValueError) as at_build:
    systems.AVAILABILITY.build("markov", num_clients=7, seed=0,
                               **{**MARKOV, "mean_online_s": 0.0})
  assert str(at_construction.value) == (
      f"availability_args: {at_build.value}")


def test_trace_files_must_exist_and_are_named(tmp_path):
  missing = tmp_path / "missing.csv"
  with pytest.raises(ValueError, match=r"^profile_args: path .*missing\.csv"
                     r".*: no such file"):
    Systems(profiles="trace", profile_args={"path": str(missing)})
  with pytest.raises(ValueError, match=r"^availability_args: path .*"
                     r"missing\.csv.*: no such file"):
    Systems(availability="intervals", availability_args={"path": missing})
  with pytest.raises(ValueError, match=r"^availability_args: availability "
                     r"'intervals' reads a CSV file"):
    Systems(availability="intervals")
  with pytest.raises(ValueError, match=r"profiles='trace' takes exactly"):
    Systems(profiles="trace", profile_args={})
  # Files that exist are accepted; their rows are read by the run (their
  # client ids depend on N).
  speeds = tmp_path / "speeds.csv"
  speeds.write_text("client_id,speed,uplink,downlink\n0,10,1000,4000\n")
  online = tmp_path / "online.csv"
  online.write_text("client_id,start_s,end_s\n0,0,10\n")
  built = Systems(profiles="trace", profile_args={"path": str(speeds)},
                  availability="intervals",
                  availability_args={"path": str(online)})
  assert built.profile_args == {"path": str(speeds)}
  model = systems.AVAILABILITY.build("intervals", num_clients=1,
                                     path=online)
  np.testing.assert_array_equal(model.online([0], 5.0), [True])


def test_good_arguments_build():
  Systems(availability="markov", availability_args=MARKOV, seed=4)
  Systems(availability="diurnal", availability_args={"online_hours": 24.0})
  Systems(profiles="lognormal", profile_args={"speed_sigma": 0.0})
  Systems(profiles="constant", profile_args={"speed": 3.0})
  Systems(over_selection=systems.MAX_OVER_SELECTION)
