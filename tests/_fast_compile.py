"""The XLA options that compile test programs fast, in a module that does
not import JAX: ``conftest.py`` sets them as XLA_FLAGS before JAX starts,
``agg_testutil`` passes them as compile options and to the processes tests
start."""

# LLVM at level 0 and the CPU backend's elemental emitters instead of its
# fusion emitters compile the same programs 2-7x faster; leaving out LLVM's
# expensive passes saved another 7 % of the aggregator and round tests'
# time (106.5 s against 114.7 s).
# One LLVM module instead of split parts compiled on threads: 10 % less
# compile time for a round (0.505 s against 0.564 s), the test workers
# already keeping every core busy.
FAST_COMPILE = {"xla_backend_optimization_level": 0,
                "xla_cpu_use_fusion_emitters": False,
                "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_parallel_codegen_split_count": 1}


def as_flags(options) -> list[str]:
  """``{name: value}`` compile options as XLA_FLAGS entries."""
  return [f"--{name}={str(value).lower()}" for name, value in
          dict(options).items()]
