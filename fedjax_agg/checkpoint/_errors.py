"""The errors of a checkpoint that cannot be used (``checkpoint``)."""


class CheckpointError(ValueError):
  """A checkpoint cannot be used to resume the run asked for."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint is unreadable, incomplete or fails its checksums."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint was written by a different run (config, shapes, rule)."""
