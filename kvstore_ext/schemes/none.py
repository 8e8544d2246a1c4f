"""No compression through the plugin path: the baseline for the plugin's own overhead."""
from .base import Scheme


class NoCompression(Scheme):
    name = 'none'
    PARAMS = {}

    def codec_for(self, shape, dtype, step=0):
        return self.uncompressed(shape, dtype)
