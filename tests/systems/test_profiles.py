"""Client profiles: task_time against its formula, the log-normal and
constant generators, the CSV reader's error cases and the registry."""

import numpy as np
import pytest

from fedjax_agg import systems


def test_task_time_is_the_formula():
  rng = np.random.default_rng(0)
  profiles = systems.lognormal_profiles(50, seed=3)
  ids = rng.integers(0, 50, 20)
  examples = rng.integers(0, 1000, 20)
  down = rng.uniform(0, 1e7, 20)
  expected = np.array([
      examples[i] / profiles.speed[c] + down[i] / profiles.downlink[c]
      + 2e6 / profiles.uplink[c] for i, c in enumerate(ids)])
  got = systems.task_time(profiles, ids, examples, down, 2e6)
  assert got.shape == (20,) and got.dtype == np.float64
  np.testing.assert_allclose(got, expected, rtol=1e-12)
  np.testing.assert_array_equal(
      systems.task_time(profiles, [], 10, 0, 0), np.zeros((0,)))


@pytest.mark.parametrize("kwargs, name", [
    ({"examples": -1.0}, "examples"), ({"down_bytes": np.nan}, "down_bytes"),
    ({"up_bytes": np.inf}, "up_bytes"), ({"examples": np.ones(3)}, "examples"),
])
def test_task_time_refuses_bad_work(kwargs, name):
  profiles = systems.constant_profiles(4)
  work = {"examples": 1.0, "down_bytes": 1.0, "up_bytes": 1.0, **kwargs}
  with pytest.raises(ValueError, match=name):
    systems.task_time(profiles, [0, 1], **work)


def test_task_time_refuses_bad_ids():
  profiles = systems.constant_profiles(4)
  with pytest.raises(ValueError, match="client_ids"):
    systems.task_time(profiles, [0, 4], 1, 1, 1)
  with pytest.raises(TypeError, match="client_ids"):
    systems.task_time(profiles, [0.5], 1, 1, 1)


def test_lognormal_sigma_zero_is_constant():
  profiles = systems.lognormal_profiles(
      100, seed=1, speed_median=7.0, speed_sigma=0.0, uplink_median=3.0,
      uplink_sigma=0.0, downlink_median=11.0, downlink_sigma=0.0)
  constant = systems.constant_profiles(100, speed=7.0, uplink=3.0,
                                       downlink=11.0)
  for got, expected in zip(profiles, constant, strict=True):
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (100,) and got.dtype == np.float64


def test_lognormal_medians_and_spread():
  profiles = systems.lognormal_profiles(40_000, seed=0, uplink_sigma=0.5)
  for field, median, sigma in ((profiles.speed, 100.0, 1.0),
                               (profiles.uplink, 1e6, 0.5),
                               (profiles.downlink, 5e6, 1.0)):
    # The sample median's log has sd ~ 1.25 sigma / sqrt(N) = 0.006 sigma.
    assert abs(np.log(np.median(field) / median)) < 0.03
    assert abs(np.std(np.log(field)) - sigma) < 0.02


def test_lognormal_is_seeded_per_quantity():
  first = systems.lognormal_profiles(100, seed=5)
  again = systems.lognormal_profiles(100, seed=5)
  other = systems.lognormal_profiles(100, seed=6)
  wider = systems.lognormal_profiles(100, seed=5, speed_sigma=2.0)
  for a, b in zip(first, again, strict=True):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first.speed, other.speed)
  np.testing.assert_array_equal(first.uplink, wider.uplink)
  np.testing.assert_array_equal(first.downlink, wider.downlink)


@pytest.mark.parametrize("kwargs, error, name", [
    ({"num_clients": 0}, ValueError, "num_clients"),
    ({"num_clients": 2.0}, TypeError, "num_clients"),
    ({"seed": -1}, ValueError, "seed"),
    ({"speed_median": 0.0}, ValueError, "speed_median"),
    ({"uplink_sigma": -0.1}, ValueError, "uplink_sigma"),
    ({"downlink_median": "5"}, TypeError, "downlink_median"),
])
def test_lognormal_refuses_bad_arguments(kwargs, error, name):
  arguments = {"num_clients": 10, "seed": 0, **kwargs}
  with pytest.raises(error, match=name):
    systems.lognormal_profiles(**arguments)


def test_constant_refuses_bad_arguments():
  with pytest.raises(ValueError, match="uplink"):
    systems.constant_profiles(3, uplink=0.0)
  with pytest.raises(ValueError, match="speed"):
    systems.constant_profiles(3, speed=np.inf)


def test_registry_builds_with_context():
  lognormal = systems.PROFILES.build("lognormal", num_clients=8, seed=2)
  np.testing.assert_array_equal(
      lognormal.speed, systems.lognormal_profiles(8, 2).speed)
  constant = systems.PROFILES.build("constant", num_clients=8, seed=2,
                                    speed=3.0)
  np.testing.assert_array_equal(constant.speed, np.full(8, 3.0))
  with pytest.raises(ValueError, match="client profiles"):
    systems.PROFILES.build("fast", num_clients=8)


def _write(tmp_path, text):
  path = tmp_path / "profiles.csv"
  path.write_text(text)
  return path


def test_read_profiles_reads_any_order(tmp_path):
  path = _write(tmp_path, "client_id,speed,uplink,downlink\n"
                "2,30,3e5,3e6\n0,10,1e5,1e6\n\n1,20.5,2e5,2e6\n")
  profiles = systems.read_profiles(path, 3)
  np.testing.assert_array_equal(profiles.speed, [10, 20.5, 30])
  np.testing.assert_array_equal(profiles.uplink, [1e5, 2e5, 3e5])
  np.testing.assert_array_equal(profiles.downlink, [1e6, 2e6, 3e6])
  systems.check_profiles(profiles)


@pytest.mark.parametrize("rows, message", [
    ("0,1,1,1\n3,1,1,1\n1,1,1,1\n", r"line 3, column client_id: unknown "
     r"client id 3"),
    ("0,1,1,1\n1,1,1,1\n", r"1 client id\(s\) .* no row, e\.g\. 2"),
    ("0,1,1,1\n1,1,1,1\n2,1,1,1\n1,2,2,2\n",
     r"line 5, column client_id: duplicate client id 1 \(first on line 3\)"),
    ("0,1,1,1\n1,fast,1,1\n2,1,1,1\n", r"line 3, column speed: expected a "
     r"number, got 'fast'"),
    ("0,1,1,1\n1,1,nan,1\n2,1,1,1\n", r"line 3, column uplink: expected a "
     r"finite number"),
    ("0,1,1,1\n1,1,1,inf\n2,1,1,1\n", r"line 3, column downlink: expected a "
     r"finite number"),
    ("0,1,1,1\n1,1,1,0\n2,1,1,1\n", r"line 3, column downlink: expected a "
     r"number > 0, got 0"),
    ("0,1,1,1\n1,-2,1,1\n2,1,1,1\n", r"line 3, column speed: expected a "
     r"number > 0"),
    ("0,1,1,1\n1.5,1,1,1\n2,1,1,1\n", r"line 3, column client_id: expected "
     r"an integer client id"),
    ("0,1,1,1\n1,1,1\n2,1,1,1\n", r"line 3: expected 4 fields"),
])
def test_read_profiles_errors_name_file_line_column(tmp_path, rows, message):
  path = _write(tmp_path, "client_id,speed,uplink,downlink\n" + rows)
  with pytest.raises(ValueError, match=message) as error:
    systems.read_profiles(path, 3)
  assert "profiles.csv" in str(error.value)


def test_read_profiles_checks_the_header(tmp_path):
  path = _write(tmp_path, "client_id,speed,downlink,uplink\n0,1,1,1\n")
  with pytest.raises(ValueError, match="line 1: the header must be "
                     "client_id,speed,uplink,downlink"):
    systems.read_profiles(path, 1)
  with pytest.raises(ValueError, match="empty file"):
    systems.read_profiles(_write(tmp_path, ""), 1)


def test_check_profiles_refuses_ragged_or_bad_values():
  good = systems.constant_profiles(3)
  with pytest.raises(ValueError, match="one length"):
    systems.check_profiles(good._replace(speed=np.ones(2)))
  with pytest.raises(ValueError, match="profiles.uplink"):
    systems.check_profiles(good._replace(uplink=np.array([1.0, 0.0, 1.0])))
  with pytest.raises(TypeError, match="ClientProfiles"):
    systems.check_profiles(tuple(good))
