"""A test plugin (`ncjax audit --plugins=tests/plugins/slow_scoring.py`): every batch the web audit decodes waits
$NCJAX_SLOW_DECODE_S seconds and appends a line to $NCJAX_DECODE_LOG, so that a test can SIGKILL an audit in the
middle of a shard (tests/cli/test_web_audit.py). Nothing in ncjax is edited."""

import os
import time

from ncjax.data.web import decode as web_decode

_decode = web_decode.ThreadDecoder.decode


def _slow_decode(self, specs, context_length):
  out = _decode(self, specs, context_length)
  time.sleep(float(os.environ.get("NCJAX_SLOW_DECODE_S", "0")))
  path = os.environ.get("NCJAX_DECODE_LOG")
  if path:
    with open(path, "a") as f:
      f.write(f"{specs[0].id} {len(specs)}\n")
  return out


web_decode.ThreadDecoder.decode = _slow_decode
