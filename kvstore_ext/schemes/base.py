"""A scheme = validated parameters + a policy choosing a codec for each tensor."""
import numpy as np

from .. import params as _params
from ..codecs import FP32Codec
from ..params import Param

# Parameters every scheme accepts: how the transport cuts large tensors.
COMMON_PARAMS = {
    'chunk_size': Param('int', 1 << 20, 'largest chunk (elements) that travels as one key; '
                        'larger tensors are cut and spread over the servers', low=1024),
}


class Scheme:
    """Subclasses set ``name`` (the kvstore type becomes ``dist_sync_<name>``),
    ``PARAMS`` (name -> params.Param) and implement ``codec_for``."""

    name = None
    PARAMS = {}

    def __init__(self, **given):
        self.params = _params.validate(dict(COMMON_PARAMS, **self.PARAMS), given, self.name)
        self.check(self.params)

    def check(self, params):
        """Checks that involve several parameters; raise ValueError."""

    def codec_for(self, shape, dtype, step=0):
        """The codec for a tensor of ``shape`` and ``dtype`` at ``step`` (how many steps
        its key has taken): at a key's first step, and at every step ``replans_at``."""
        raise NotImplementedError

    def replans_at(self, step):
        """True if ``codec_for`` may choose differently at ``step`` than before: the store
        then asks it again (every worker at the same step, so their plans agree), and
        keeps a key's codec if it encodes the same. Schemes that re-plan override this
        (warm-up, layer-wise adaptation)."""
        return False

    @staticmethod
    def uncompressed(shape, dtype):
        """Codec for tensors the scheme leaves alone: float32 pass-through."""
        return FP32Codec(shape)

    def plan(self, shapes):
        """{name: codec description} for a dict of shapes: what the policy decides."""
        return {k: self.codec_for(s, np.float32).describe() for k, s in shapes.items()}
