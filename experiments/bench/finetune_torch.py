"""The client-by-client loop of ``finetune_bench.py``: the same
``transformer_lm`` in PyTorch, the base's weights loaded, PEFT's LoRA on
the same six matrices a block, each client trained in turn.

Needs ``torch`` and ``peft`` (neither is a dependency of the library);
``finetune_bench.py`` skips the loop where they do not import.
"""

import math
import os
import resource
import time

import numpy as np
import peft
import torch
from torch import nn

PAD_TARGET = -1  # the library's padding target (types.PAD_TARGET)
TARGETS = ["query", "key", "value", "out", "fc1", "fc2"]


def _gelu(x):
  # flax's nn.gelu is the tanh approximation by default.
  return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (
      x + 0.044715 * x ** 3)))


class Block(nn.Module):
  """Pre-LayerNorm causal self-attention and a 4x GELU MLP."""

  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln0, self.ln1 = (nn.LayerNorm(width, eps=1e-6),
                          nn.LayerNorm(width, eps=1e-6))
    self.query, self.key, self.value, self.out = (
        nn.Linear(width, width) for _ in range(4))
    self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width,
                                                                width)

  def forward(self, x, mask):
    b, t, w = x.shape
    h = self.ln0(x)
    split = lambda z: z.view(b, t, self.heads, w // self.heads).transpose(
        1, 2)
    q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
    scores = q @ k.transpose(-1, -2) / math.sqrt(w // self.heads)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, w)
    x = x + self.out(attended)
    return x + self.fc2(_gelu(self.fc1(self.ln1(x))))


class TransformerLM(nn.Module):
  """The library's ``transformer_lm`` (models/sequence.py), in PyTorch."""

  def __init__(self, vocab: int, width: int, depth: int, heads: int,
               max_length: int):
    super().__init__()
    self.embed = nn.Embedding(vocab, width)
    self.positions = nn.Parameter(torch.zeros(max_length, width))
    self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
    self.ln = nn.LayerNorm(width, eps=1e-6)
    self.head = nn.Linear(width, vocab)

  def forward(self, tokens):
    t = tokens.shape[-1]
    x = self.embed(tokens) + self.positions[:t]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln(x))


def from_flax(variables, num_classes: int, width: int, depth: int,
              heads: int, max_length: int) -> TransformerLM:
  """A ``TransformerLM`` holding the flax variables' weights."""
  params = variables["params"]
  model = TransformerLM(num_classes, width, depth, heads, max_length)
  t = lambda a: torch.tensor(np.asarray(a, np.float32))

  def dense(linear, node, flat_in=None, flat_out=None):
    kernel = np.asarray(node["kernel"], np.float32)
    kernel = kernel.reshape(flat_in or kernel.shape[0], -1) if (
        flat_out is None) else kernel.reshape(-1, flat_out)
    linear.weight.data = t(kernel.T)
    linear.bias.data = t(np.asarray(node["bias"]).reshape(-1))

  def norm(layer, node):
    layer.weight.data, layer.bias.data = t(node["scale"]), t(node["bias"])
  model.embed.weight.data = t(params["Embed_0"]["embedding"])
  model.positions.data = t(params["positions"])
  for i, block in enumerate(model.blocks):
    node = params[f"_Block_{i}"]
    attention = node["MultiHeadDotProductAttention_0"]
    for name in ("query", "key", "value"):
      dense(getattr(block, name), attention[name], flat_in=width)
    dense(block.out, attention["out"], flat_out=width)
    dense(block.fc1, node["Dense_0"])
    dense(block.fc2, node["Dense_1"])
    norm(block.ln0, node["LayerNorm_0"])
    norm(block.ln1, node["LayerNorm_1"])
  norm(model.ln, params["LayerNorm_0"])
  dense(model.head, params["Dense_0"])
  return model


def checked_model(base, x) -> tuple[TransformerLM, float]:
  """The base in PyTorch and its largest logit gap from the engine's base
  on four client rows (refused above 1e-4), checked before any timing."""
  args = base.record["model_args"]
  model = from_flax(base.variables, 80, args["width"], args["depth"],
                    args["heads"], 80)
  logits, _ = base.model.apply(base.variables, x[0, :4], False)
  with torch.no_grad():
    ours = model(torch.tensor(x[0, :4], dtype=torch.long)).numpy()
  gap = float(np.max(np.abs(ours - np.asarray(logits))))
  if gap > 1e-4:
    raise AssertionError(f"the PyTorch model differs from the base by {gap}")
  return model, gap


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def loop_round(base, x, y, rounds: int, threads, *, rank: int, batch: int,
               learning_rate: float) -> dict:
  """Median wall and CPU seconds of a FedIT round trained client by
  client (``threads``: torch's thread count; None: its default)."""
  default_threads = torch.get_num_threads()
  torch.set_num_threads(threads or default_threads)
  model, gap = checked_model(base, x)
  config = peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0,
                           target_modules=TARGETS, bias="none")
  result = timed_rounds(peft.get_peft_model(model, config), x, y, rounds,
                        batch=batch, learning_rate=learning_rate)
  torch.set_num_threads(default_threads)
  return {**result, "threads": threads or default_threads,
          "logit_gap": gap}


def timed_rounds(model, x, y, rounds: int, *, batch: int,
                 learning_rate: float) -> dict:
  """FedIT rounds of a PEFT ``model`` over the clients' rows (x, y
  [K, rows, T]) one client after another: each from the global adapters,
  SGD over its batches, then the mean of A and B; the first round apart,
  then the median wall and CPU seconds of the next ``rounds``."""
  names = [n for n, p in model.named_parameters() if p.requires_grad]
  params = dict(model.named_parameters())
  global_adapters = {n: params[n].detach().clone() for n in names}
  xs = torch.tensor(x, dtype=torch.long)
  ys = torch.tensor(y, dtype=torch.long)
  loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_TARGET)
  times = []
  for _ in range(rounds + 1):
    start, cpu = time.perf_counter(), _cpu()
    total = {n: torch.zeros_like(v) for n, v in global_adapters.items()}
    for k in range(xs.shape[0]):
      with torch.no_grad():
        for n in names:
          params[n].copy_(global_adapters[n])
      optimizer = torch.optim.SGD([params[n] for n in names],
                                  lr=learning_rate)
      for first in range(0, xs.shape[1], batch):
        xb, yb = xs[k, first:first + batch], ys[k, first:first + batch]
        optimizer.zero_grad()
        out = model(xb)
        out = getattr(out, "logits", out)  # transformers' output object
        loss = loss_fn(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
        loss.backward()
        optimizer.step()
      with torch.no_grad():
        for n in names:
          total[n] += params[n]
    global_adapters = {n: v / xs.shape[0] for n, v in total.items()}
    times.append((time.perf_counter() - start, _cpu() - cpu))
  later = times[1:]
  return {"variant": "loop", "clients": int(xs.shape[0]),
          "first_round_s": round(times[0][0], 3),
          "round_s": round(float(np.median([w for w, _ in later])), 4),
          "cpu_s": round(float(np.median([c for _, c in later])), 4),
          "rounds": len(later), "torch": torch.__version__,
          "peft": peft.__version__,
          "os_threads_env": os.environ.get("OMP_NUM_THREADS")}
