// The plugin's (and the test library's) entry point that MXNet calls when it loads it.
#include "op_util.h"

using namespace kvx_ops;

// lib_api v11 ships with MXNet 1.7+; MXNet passes its version as 10000*major + 100*minor.
MXReturnValue initialize(int version) {
  if (version >= 10700) return MX_SUCCESS;
  MX_ERROR_MSG << "kvx_ops needs MXNet >= 1.7 (lib_api v11), found version " << version;
  return MX_FAIL;
}
