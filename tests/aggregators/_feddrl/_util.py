"""The FedDRL tests' cohort size and agent configuration."""

from fedjax_agg.aggregators._feddrl import AgentConfig


K = 4
CONFIG = AgentConfig(policy_hidden=(16, 16, 16), value_hidden=(16, 16),
                     buffer_capacity=16, batch_size=8, updates_per_round=2,
                     min_buffer_size=3, beta=0.4, max_mean=3.0)
