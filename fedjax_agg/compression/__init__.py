"""Compressed client updates: codecs with exact message sizes.

A *codec* compresses one flat float32 vector x [d] (one leaf of a client's
update w_k - g, flattened): ``encode(x, key) -> payload`` on the client,
``decode(payload, d) -> x_hat`` [d] on the server, and ``bits(d)``, the
exact size of one message (a static Python int: 32 bits per float32 field,
b bits per b-bit integer field). Randomness that client and server both
derive from a shared seed (the round and the client id) is free.

=====================  ===========================  ========  ==========
codec                  bits(d)                      unbiased  reference
=====================  ===========================  ========  ==========
``identity()``         32 d                         exact
``uniform(b)``         b d + 64                     yes
``qsgd(b)``            32 + b d                     yes       [1]
``top_k(f)``           k (32 + ceil(log2 d))        no
``random_k(f)``        32 k + 32                    yes
``sign()``             d + 32                       no        [2]
``hadamard(inner)``    inner.bits(next pow2 >= d)   = inner   [3]
=====================  ===========================  ========  ==========

k = max(1, ceil(f d)). [1] Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD:
Communication-Efficient SGD via Gradient Quantization and Encoding",
NeurIPS 2017 (sent with fixed-width fields, not its Elias coding). [2]
Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", ICML 2019. [3] Vargaftik, Ben-Basat,
Portnoy, Mendelson, Ben-Itzhak, Mitzenmacher, "DRIVE: One-bit Distributed
Mean Estimation", NeurIPS 2021 (and EDEN, ICML 2022): the random rotation.

Scale. The quantisers work on x divided by a power of two near max |x_i|
(``tree_math.power_of_two_scale``, exact), the rotation too once max |x_i|
> 2^64, so scaling x by a power of two scales x_hat by it exactly (entries
below float32's normal range, 1.2e-38, are flushed to 0 on CPU). Range:
for finite x with ||x||_2 <= float32's max (3.4e38), every codec's
decode(encode(x, key), d) is finite, for any key, jitted or not. Values
past the range saturate at +-3.4e38: random_k's x_i d / k (biased there),
and entries that rounding, or hadamard's inverse rotation, takes past it.

Non-finite updates. The codecs are defined for finite x (a NaN may vanish,
e.g. when top_k does not pick it); ``compress_tree`` decodes a leaf with a
non-finite entry as all NaN, so the round's non-finite exclusion still
sees a diverged client. ``with_codec`` compresses every client's update in
the jitted round, optionally with error feedback; message sizes are
host-side numbers (``message_bytes(codec, params)`` per client).
"""

from fedjax_agg.compression._codecs import CODEC_STREAM
from fedjax_agg.compression._codecs import Codec
from fedjax_agg.compression._codecs import CODECS
from fedjax_agg.compression._codecs import get
from fedjax_agg.compression._codecs import hadamard
from fedjax_agg.compression._codecs import identity
from fedjax_agg.compression._codecs import qsgd
from fedjax_agg.compression._codecs import random_k
from fedjax_agg.compression._codecs import rotate
from fedjax_agg.compression._codecs import sign
from fedjax_agg.compression._codecs import top_k
from fedjax_agg.compression._codecs import uniform
from fedjax_agg.compression._codecs import unrotate
from fedjax_agg.compression._codecs import walsh_hadamard
from fedjax_agg.compression._uplink import compress_tree
from fedjax_agg.compression._uplink import compress_updates
from fedjax_agg.compression._uplink import CompressionState
from fedjax_agg.compression._uplink import message_bits
from fedjax_agg.compression._uplink import message_bytes
from fedjax_agg.compression._uplink import with_codec

__all__ = ["CODECS", "CODEC_STREAM", "Codec", "CompressionState",
           "compress_tree", "compress_updates", "get", "hadamard",
           "identity", "message_bits", "message_bytes", "qsgd", "random_k",
           "rotate", "sign", "top_k", "uniform", "unrotate",
           "walsh_hadamard", "with_codec"]
