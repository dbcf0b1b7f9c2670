"""A test plugin (`ncjax train --plugins=tests/plugins/change_shard_mid_read.py`): after the first
$NCJAX_CHANGE_AFTER_READS ranged reads of the local shard $NCJAX_CHANGE_SHARD, that shard is written over in place
(its captions changed, every byte where it was: the index's offsets still fit) while the reader's descriptor of it
is open — what tests/train/test_web_changes.py runs through the CLI. Nothing in ncjax is edited."""

import os
import threading

from ncjax.data.web import store

_pread = store._LocalFiles.pread   # noqa: SLF001
_state = {"reads": 0, "lock": threading.Lock()}


def _changing_pread(self, path, start, end, pin=""):
  target = os.environ.get("NCJAX_CHANGE_SHARD", "")
  if path == target:
    with _state["lock"]:
      _state["reads"] += 1
      if _state["reads"] == int(os.environ.get("NCJAX_CHANGE_AFTER_READS", "3")) + 1:
        with open(path, "r+b") as f:   # `cp` of a re-downloaded shard over this one: the same inode
          data = f.read()
          f.seek(0)
          f.write(data.replace(b"skyline", b"SKYLINE"))
  return _pread(self, path, start, end, pin)


store._LocalFiles.pread = _changing_pread   # noqa: SLF001
