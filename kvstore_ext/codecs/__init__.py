"""Per-tensor codecs wrapping the C++ kernels."""
from .base import Codec  # noqa: F401
from .fp32 import FP32Codec  # noqa: F401
from .topk import FilterTopKCodec  # noqa: F401
from .ternary import TernaryCodec  # noqa: F401
from .homomorphic import HomTernaryCodec, HomTopKCodec  # noqa: F401
