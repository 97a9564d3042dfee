"""Time online measured by walking an availability model's queries."""

import numpy as np


def _online_time(model, ids, horizon):
  """Seconds each client is online in [0, horizon], by walking intervals."""
  t = np.zeros(ids.shape)
  total = np.zeros(ids.shape)
  sojourns = 0
  while True:
    live = t < horizon
    if not live.any():
      return total, sojourns
    until = np.minimum(model.online_until(ids[live], t[live]), horizon)
    total[live] += until - t[live]
    t[live] = np.minimum(model.next_online(ids[live], until), horizon)
    sojourns += live.sum()
