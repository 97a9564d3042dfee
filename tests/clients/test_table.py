"""The per-client state table: padding rows never write."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import clients


def test_table_padding_rows_never_write_even_with_duplicate_ids():
  table = clients.init_table(5, {"a": jax.ShapeDtypeStruct((2,),
                                                           jnp.float32)})
  ids = jnp.array([3, 1, 3])  # the last row pads with a real client's id
  rows = {"a": jnp.array([[1.0, 1.0], [2.0, 2.0], [9.0, 9.0]])}
  new = jax.jit(clients.scatter)(table, ids, rows,
                                 jnp.array([True, True, False]))
  np.testing.assert_array_equal(new.rows["a"][3], [1.0, 1.0])
  np.testing.assert_array_equal(new.rows["a"][1], [2.0, 2.0])
  np.testing.assert_array_equal(new.seen, [False, True, False, True, False])
  got = jax.jit(clients.gather)(new, jnp.array([0, 3]),
                                {"a": jnp.array([7.0, 7.0])})
  np.testing.assert_array_equal(got["a"], [[7.0, 7.0], [1.0, 1.0]])
