"""Per-tensor codecs wrapping the C++ kernels."""
from .base import Codec, GatherCodec  # noqa: F401
from .fp32 import FP32Codec  # noqa: F401
from .topk import FilterTopKCodec  # noqa: F401
from .ternary import TernaryCodec  # noqa: F401
from .additive import AdditiveTernaryCodec, AdditiveTopKCodec  # noqa: F401
from .adacomp import AdaCompCodec  # noqa: F401
from .element_topk import ElementTopKCodec  # noqa: F401
from .fp16 import Float16Codec  # noqa: F401
from .momentum import (HighRateMasking, MomentumTopKCodec,  # noqa: F401
                       MomentumAdditiveTopKCodec, MomentumElementTopKCodec,
                       MomentumTernaryCodec, MomentumAdditiveTernaryCodec)
from .thc import ThcCodec  # noqa: F401
from .powersgd import PowerSGDCodec  # noqa: F401
from .outer import OuterCodec  # noqa: F401
